"""Plain-PyTorch reference attention over a `SpecCache`: dense, exact, GQA-aware, sliding-window aware, plus the
self-speculation features: score collection in verify/prefill passes and selection-restricted draft steps.

Every faster or sparser backend is tested against this one, and this one against transformers' own attention.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..step import DeviceView, Phase, ScoreCollection
from .dispatch import register_backend
from .scores import collected_rows, reduce_scores


@dataclasses.dataclass(frozen=True)
class LogitMods:
    """What a layer does to its logits beyond ``q . k * scale``; both None for plain attention.

    Attributes:
        softcap: logit soft-capping ``softcap * tanh(logit / softcap)`` (Gemma 2, Cohere 2), applied before masking.
        sinks: ``[H]`` per-head sink logit that joins the softmax denominator and attends to nothing (GPT-OSS).
        alibi: ``[H]`` per-head ALiBi slopes (BLOOM, MPT): ``slope * j`` added to the logit of cache slot ``j``.
            Their models add ``slope * (j - n)`` for some ``n`` fixed per row (the row's padding, or the key
            length), which the softmax does not see.
    """

    softcap: float | None = None
    sinks: torch.Tensor | None = None
    alibi: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        return self.softcap is None and self.sinks is None and self.alibi is None


PLAIN = LogitMods()

#: dtypes SDPA's flash attention takes: prefill chunks in these read grouped KV heads in place
_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_HEAD_DIM = 256
#: query rows per explicit-logits block in prefill: bounds the float32 ``[B, H, rows, L]`` logits of long prompts
ROW_CHUNK = 512


def _row_logits(
    query: torch.Tensor, key: torch.Tensor, scaling: float, mods: LogitMods = PLAIN
) -> torch.Tensor:
    """Logits ``[B, H, q, L]`` (float32, soft-capped if the layer caps) of ``query`` ``[B, H, q, D]`` over ``key``
    ``[B, H_kv, L, D]``."""
    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.float().reshape(batch, kv_heads, (heads // kv_heads) * q_len, dim)  # a KV head's query heads
    logits = (torch.matmul(q, key.float().transpose(-1, -2)) * scaling).view(batch, heads, q_len, length)
    if mods.softcap is not None:
        logits = torch.tanh(logits / mods.softcap) * mods.softcap
    if mods.alibi is not None:
        slots = torch.arange(length, device=logits.device, dtype=torch.float32)
        logits = logits + mods.alibi.float().view(1, heads, 1, 1) * slots
    return logits


def _attention_with_logits(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
    mods: LogitMods = PLAIN,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention that also returns its logits: out ``[B, H, q, D_v]``, logits ``[B, H, q, L]`` (float32, after
    soft-capping). ``value`` ``[B, H_kv, L, D_v]`` may have another head size than ``key``."""
    batch, heads, q_len, _ = query.shape
    kv_heads, length, v_dim = key.shape[1], key.shape[2], value.shape[-1]
    logits = _row_logits(query, key, scaling, mods)
    masked = logits.masked_fill(~mask, float("-inf"))
    if mods.sinks is not None:  # the sink joins the denominator, then is dropped
        sink = mods.sinks.float().view(1, heads, 1, 1).expand(batch, heads, q_len, 1)
        probs = torch.softmax(torch.cat([masked, sink], dim=-1), dim=-1)[..., :length]
    else:
        probs = torch.softmax(masked, dim=-1)
    out = torch.matmul(probs.reshape(batch, kv_heads, (heads // kv_heads) * q_len, length), value.float())
    return out.view(batch, heads, q_len, v_dim).to(query.dtype), logits


def _collect_verify(
    collection: ScoreCollection, layer: int, logits: torch.Tensor, mask: torch.Tensor, kv_heads: int
) -> None:
    rows = collected_rows(logits.shape[2], "all_rows" if collection.rows == "per_row" else collection.rows)
    carried = collection.carried_lse(layer)  # [B, H] or None
    scores = reduce_scores(
        logits[:, :, rows], mask[:, :, rows], collection, kv_heads, per_row=collection.rows == "per_row",
        lse=carried,
    )  # fmt: skip
    collection.write(layer, scores)
    # the next verify step normalises by this step's first row (the last committed token)
    if carried is not None:
        carried.copy_(_row_lse(logits, mask, 0))


def _collect_prefill(
    collection: ScoreCollection,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor,
    scaling: float,
    kv_heads: int,
    mods: LogitMods,
) -> None:
    """The first selection's scores: the prompt's last `ScoreCollection.PREFILL_SEED_ROWS` query rows."""
    rows = min(collection.PREFILL_SEED_ROWS, query.shape[2])
    logits = _row_logits(query[:, :, -rows:], key, scaling, mods)  # [B, H, rows, L]
    kind = ScoreCollection(rows="all_rows", weights=collection.weights, per_kv_head=collection.per_kv_head)
    collection.write(layer, reduce_scores(logits, mask[:, :, -rows:], kind, kv_heads))
    if collection.lse == "carried":
        collection.carry(layer, _row_lse(logits, mask[:, :, -rows:], -1))  # the prompt's last token


def _row_lse(logits: torch.Tensor, mask: torch.Tensor, row: int) -> torch.Tensor:
    """``[B, H]`` log-sum-exp of query row ``row``'s logits ``[B, H, q, L]`` over the slots it attends (the cached
    slots alone, as the weights)."""
    return torch.logsumexp(logits[:, :, row].masked_fill(~mask[:, :, row], float("-inf")), dim=-1)


@register_backend("reference")
def reference_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    view: DeviceView,
    *,
    scaling: float,
    sliding_window: int | None = None,
    mods: LogitMods = PLAIN,
) -> torch.Tensor:
    """Attention of ``q`` new tokens per row over the valid cache slots.

    Args:
        query: ``[B, H, q, D]``.
        key, value: ``[B, H_kv, capacity, D]`` and ``[B, H_kv, capacity, D_v]`` cache buffers, ``H % H_kv == 0``
            (``D_v`` may differ from ``D``, as in multi-head latent attention).
        view: the step's tensors on this device (slots, masks; the step's slots).
        scaling: softmax scale.
        sliding_window: window of a sliding-attention layer, or None.
        mods: soft-capping and attention sinks (`LogitMods`); layers with either run the explicit-logits path.

    Returns:
        ``[B, q, H, D_v]``, the layout transformers' attention functions return.
    """
    step = view.step
    layer = module.layer_idx
    key = key[:, :, : step.kv_len]  # [B, H_kv, L, D]
    value = value[:, :, : step.kv_len]
    kv_heads = key.shape[1]
    gqa = query.shape[1] != kv_heads
    collection = step.score_collection()

    if collection is not None and step.phase is Phase.VERIFY:
        mask = view.mask(sliding_window)
        out, logits = _attention_with_logits(query, key, value, mask, scaling, mods)
        _collect_verify(collection, layer, logits, mask, kv_heads)
        return out.transpose(1, 2).contiguous()
    selection = step.draft_selection()
    if selection is not None:
        allowed = selection.allowed(layer, query, key, view.pad, step.kv_len)  # [B, L] or [B, H_kv, L]
        if allowed.dim() == 3:  # one selection per KV head: expand to its query heads
            allowed = allowed.repeat_interleave(query.shape[1] // kv_heads, dim=1)[:, :, None, :]
        else:
            allowed = allowed[:, None, None, :]
        mask = view.mask(sliding_window) & allowed
        if not mods.plain:
            return (
                _attention_with_logits(query, key, value, mask, scaling, mods)[0].transpose(1, 2).contiguous()
            )
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous()

    if not mods.plain:  # SDPA has no soft-capping or sinks: explicit logits, in chunks of query rows
        mask = view.mask(sliding_window)
        out = torch.cat(
            [
                _attention_with_logits(
                    query[:, :, i : i + ROW_CHUNK], key, value, mask[:, :, i : i + ROW_CHUNK], scaling, mods
                )[0]
                for i in range(0, query.shape[2], ROW_CHUNK)
            ],
            dim=2,
        )
        if collection is not None and step.phase is Phase.PREFILL:
            _collect_prefill(collection, layer, query, key, mask, scaling, kv_heads, mods)
        return out.transpose(1, 2).contiguous()
    causal = view.is_plain_causal(sliding_window) or view.is_chunk_causal(sliding_window)
    flash_ok = (
        query.is_cuda and query.dtype in _FLASH_DTYPES and key.shape[-1] == value.shape[-1] <= _FLASH_HEAD_DIM
    )
    flash = causal and flash_ok
    if flash_ok and _is_padded_chunk(view, sliding_window):
        out = _padded_chunk_attention(query, key, value, view, scaling)
        if collection is not None:
            _collect_prefill(
                collection, layer, query, key, _last_rows_mask(view, collection), scaling, kv_heads, PLAIN
            )
        return out
    if gqa and query.is_cuda and step.phase is Phase.PREFILL and not flash:
        # SDPA's memory-efficient kernel takes float32 and masks but not grouped heads; without it SDPA falls back
        # to the math kernel, whose [B, H, q, L] attention matrix does not fit for long prompts
        group = query.shape[1] // kv_heads
        key, value, gqa = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1), False
    if view.is_plain_causal(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    elif flash and view.is_chunk_causal(sliding_window):
        # a later prefill chunk: causal aligned to the lower right, which SDPA runs as flash attention (half
        # precision, grouped heads read in place) or memory-efficient attention, without a [B, 1, q, L] mask
        bias = causal_lower_right(step.q_len, step.kv_len)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scaling, enable_gqa=gqa)
    elif view.is_full_row(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=gqa)
    else:
        mask = view.mask(sliding_window)  # [B, 1, q, L]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    if collection is not None and step.phase is Phase.PREFILL:
        # the mask of the last rows, without building the whole one, where every row's chunk ends at kv_len
        mask = _last_rows_mask(view, collection) if causal else view.mask(sliding_window)
        _collect_prefill(collection, layer, query, key, mask, scaling, kv_heads, PLAIN)
    return out.transpose(1, 2).contiguous()


def _is_padded_chunk(view: DeviceView, sliding_window: int | None) -> bool:
    """A prefill chunk of a left-padded batch: every row's chunk ends at ``kv_len`` (host-side facts only)."""
    step = view.step
    return not step.no_padding and step.host_pad is not None and view.is_prefill_chunk(sliding_window)


def _padded_chunk_attention(query, key, value, view: DeviceView, scaling: float) -> torch.Tensor:
    """Causal attention of a left-padded prefill chunk, one row at a time: row ``b`` attends to its slots
    ``[pad_b, kv_len)`` through SDPA's lower-right causal mask (flash attention, grouped KV heads in place), so no
    ``[B, 1, q, L]`` mask is built. Queries on padding slots attend to their own slot only, as `DeviceView.mask`
    lets them (finite values no real token reads). The pads come from the host (`StepContext.host_pad`).

    Returns ``[B, q, H, D_v]``.
    """
    step = view.step
    first = step.kv_len - step.q_len  # every row's chunk starts here
    group = query.shape[1] // key.shape[1]
    out = torch.empty_like(query)
    for row, pad in enumerate(step.host_pad):
        # the chunk's first `padding` query rows sit on padding slots, the rest on real ones
        padding = min(step.q_len, max(0, pad - first))
        if padding:  # padding queries: their own slot's value
            own = view.query_slots[row, :padding]
            out[row, :, :padding] = value[row, :, own].repeat_interleave(group, dim=0)
        if padding < step.q_len:
            out[row : row + 1, :, padding:] = F.scaled_dot_product_attention(
                query[row : row + 1, :, padding:],
                key[row : row + 1, :, pad : step.kv_len],
                value[row : row + 1, :, pad : step.kv_len],
                attn_mask=causal_lower_right(step.q_len - padding, step.kv_len - pad),
                scale=scaling,
                enable_gqa=group > 1,
            )
    return out.transpose(1, 2).contiguous()


def _last_rows_mask(view: DeviceView, collection: ScoreCollection) -> torch.Tensor:
    """`DeviceView.mask` of a prefill chunk's last `ScoreCollection.PREFILL_SEED_ROWS` query rows only, for chunks
    that end at ``kv_len`` in every row (no sliding window): ``[B, 1, rows, kv_len]``."""
    step = view.step
    rows = min(collection.PREFILL_SEED_ROWS, step.q_len)
    slots = torch.arange(step.kv_len, device=view.device)
    own = torch.arange(step.kv_len - rows, step.kv_len, device=view.device)[None, :, None]  # [1, rows, 1]
    mask = ((slots <= own) & (slots >= view.pad[:, None, None])) | (slots == own)
    return mask[:, None]
