"""Plain-PyTorch reference attention over a `SpecCache`: dense, exact, GQA-aware, sliding-window aware, plus the
self-speculation features: score collection in verify/prefill passes and selection-restricted draft steps.

Every faster or sparser backend is tested against this one, and this one against transformers' own attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import register_backend
from .selection import PREFILL_SEED_ROWS, SparseLayerState, head_mean_logits, page_summaries, select_quest
from .step import DeviceView


def _attention_with_logits(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention that also returns its raw logits: out ``[B, H, q, D]``, logits ``[B, H, q, L]`` (float32)."""
    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    q = query.reshape(batch, kv_heads, group * q_len, dim)  # query heads of one KV head side by side
    logits = torch.matmul(q.float(), key.float().transpose(-1, -2)) * scaling  # [B, Hkv, G*q, L]
    logits = logits.view(batch, heads, q_len, length)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    out = torch.matmul(probs.view(batch, kv_heads, group * q_len, length), value.float())
    return out.view(batch, heads, q_len, dim).to(query.dtype), logits


def _reduce_rows(logits: torch.Tensor, collect: str) -> torch.Tensor:
    """Head-averaged scores from ``[B, H, q, L]`` logits for the rows ``collect`` names."""
    per_row = logits.mean(dim=1)  # [B, q, L]
    if collect == "two_rows":
        rows = [0, per_row.shape[1] - 1] if per_row.shape[1] > 1 else [0]
        return per_row[:, rows].mean(dim=1)
    if collect == "all_rows":
        return per_row.mean(dim=1)
    if collect == "per_row":
        return per_row
    raise ValueError(f"unknown score collection {collect!r}")


def _draft_mask(
    view: DeviceView, state: SparseLayerState, query: torch.Tensor, key: torch.Tensor, window: int | None
) -> torch.Tensor:
    """The dense mask restricted to the layer's selection (plus the slots appended since it was made)."""
    length = view.step.kv_len
    if state.quest_budget is not None:
        if state.page_min is None:
            state.page_min, state.page_max = page_summaries(key[:, :, : state.prefix_end], state.page_size)
        selected = select_quest(
            query,
            state.page_min,
            state.page_max,
            view.pad,
            state.recent_start,
            state.quest_budget,
            state.quest_budget_max,
            state.page_size,
            length,
        )
    else:
        selected = state.selected[:, :length]
    slots = torch.arange(length, device=query.device)
    allowed = selected | (slots[None, :] >= state.recent_start[:, None])  # [B, L]
    return view.mask(window) & allowed[:, None, None, :]


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
) -> torch.Tensor:
    """Attention of ``q`` new tokens per row over the valid cache slots.

    Args:
        query: ``[B, H, q, D]``.
        key, value: ``[B, H_kv, capacity, D]`` cache buffers, ``H % H_kv == 0``.
        view: the step's tensors on this device (slots, masks, per-layer state).
        scaling: softmax scale.
        sliding_window: window of a sliding-attention layer, or None.

    Returns:
        ``[B, q, H, D]``, the layout transformers' attention functions return.
    """
    step = view.step
    key = key[:, :, : step.kv_len]  # [B, H_kv, L, D]
    value = value[:, :, : step.kv_len]
    gqa = query.shape[1] != key.shape[1]
    state: SparseLayerState | None = step.layer_state(module.layer_idx)

    if state is not None and step.phase == "verify" and state.collect:
        out, logits = _attention_with_logits(query, key, value, view.mask(sliding_window), scaling)
        state.scores = _reduce_rows(logits, state.collect)
        return out.transpose(1, 2).contiguous()
    if (
        state is not None
        and step.phase == "draft"
        and (state.selected is not None or state.quest_budget is not None)
    ):
        mask = _draft_mask(view, state, query, key, sliding_window)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous()

    if view.is_plain_causal(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    elif view.is_full_row(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=gqa)
    else:
        mask = view.mask(sliding_window)  # [B, 1, q, L]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    if state is not None and step.phase == "prefill" and state.collect == "last_rows":
        rows = min(PREFILL_SEED_ROWS, query.shape[2])
        state.scores = head_mean_logits(query[:, :, -rows:], key, scaling).mean(dim=1)  # [B, L]
    return out.transpose(1, 2).contiguous()
