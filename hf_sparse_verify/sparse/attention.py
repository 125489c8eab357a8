"""Block-sparse verify attention (LOSSY): the sparse-verification paper §3.1-3.3 with the SSV paper's grouped schedules.

Per verify step and layer, each (row, KV head) attends to a set of KV blocks of `SparseAttention.block_size` slots:

- forced (the kernel adds them itself): the sink block (holding the row's first real token) and the blocks
  holding the new tokens;
- the ``local_blocks`` blocks right before the new tokens (scored +inf, so always picked);
- the top-scoring other blocks, up to the row's budget (§3.2: every block while the row holds at most
  ``dense_below`` tokens, else ``((L - dense_below) * rho + dense_below) / block_size`` blocks, forced ones included).

A block's score (Eq. 5) is the query against the block's mean key, or with ``score="bounds"`` Quest's upper bound
from the block's elementwise key minimum and maximum (`hf_sparse_verify.kernels.block_summary.bounds`), summed over
the query heads of the KV head (the GQA group shares one selection). Which query scores depends on the schedule: the row's first verify token for
every verify token (``"shared"``), the mean of every verify token's score for one selection of the row
(``"shared_window"``), the first token of each group of ``group_size`` (``"approx_shared"``) or every
token for itself (``"exact_merged"``: the union is loaded once by the kernel and masked per query).

Mean keys (or bounds) are kept per layer (`build` after the prefill, then refreshed in place inside every verify step from the
keys the step wrote, so they follow rollbacks: blocks past a row's length are never scored). Layers that reuse an
anchor's selection (§3.3) keep no summaries and score nothing.

Everything runs on the device from fixed tensors and shapes: no host sync, capturable in the verify graphs.
"""

from __future__ import annotations

import torch

from ..kernels.block_sparse import block_sparse_attention, merge_query_blocks
from ..kernels.block_sparse.naive import selected_block_mask
from ..kernels.block_summary import build_block_summaries, score_blocks, update_block_summaries
from ..kernels.block_summary.bounds import build_block_bounds, score_block_bounds, update_block_bounds
from ..kernels.topk_slots import topk_slots
from .config import SparseAttention


def nearest_anchors(num_layers: int, anchors: list[int] | None) -> list[int]:
    """Layer -> the layer whose selection it uses: itself when it is an anchor (or without anchors), else the
    nearest preceding anchor (layers before the first anchor select for themselves).

    Example:
        >>> nearest_anchors(6, [0, 3])
        [0, 0, 0, 3, 3, 3]
        >>> nearest_anchors(3, None)
        [0, 1, 2]
    """
    if anchors is None:
        return list(range(num_layers))
    source, current = [], None
    chosen = set(anchors)
    for layer in range(num_layers):
        if layer in chosen or current is None:
            current = layer
        source.append(current)
    return source


def row_budget(cfg: SparseAttention, length: torch.Tensor) -> torch.Tensor:
    """Blocks each row keeps, ``[B]`` int64, from its token count ``length`` ``[B]`` (device twin of
    `SparseAttention.budget_blocks`)."""
    blocks = (length + cfg.block_size - 1) // cfg.block_size
    keep = ((length - cfg.dense_below).clamp_min(0).double() * cfg.rho + cfg.dense_below).long()
    sparse = (keep + cfg.block_size - 1) // cfg.block_size
    return torch.where(length <= cfg.dense_below, blocks, torch.minimum(blocks, sparse))


class BlockSparseVerifyAttention:
    """The attention part of a `hf_sparse_verify.sparse.state.SparseVerifyState`.

    Args:
        cfg: the settings.
        num_layers: decoder layers of the model.
        anchors: layers that select blocks (§3.3 reuse); None: every layer selects.
        record: calibration mode: every selecting layer stores its block mask in `recorded` and the step runs
            dense (the selection is computed, not used).
    """

    def __init__(
        self, cfg: SparseAttention, num_layers: int, anchors: list[int] | None = None, record: bool = False
    ):
        self.cfg = cfg
        self.source = nearest_anchors(num_layers, anchors)
        # layer -> its block summaries: mean keys [B, H_kv, NB, D] (score "mean") or bounds [2, B, H_kv, NB, D]
        self.mean_key: dict[int, torch.Tensor] = {}
        self.record = record
        self.recorded: dict[int, torch.Tensor] = {}  # layer -> [B, H_kv, NB] bool (record mode)
        self._selection: dict[int, tuple] = {}  # layer -> its selection in the running forward
        # "shared_window": batch -> each row's drafted tokens in the coming verify step ([B] int64, filled in place
        # by `drafted` so that captured graphs read the current step's; every verify token counts until then)
        self.drafts: dict[int, torch.Tensor] = {}

    def selecting_layers(self) -> list[int]:
        return sorted(set(self.source))

    def build(self, cache, pad: torch.Tensor, length: torch.Tensor) -> None:
        """Block summaries (mean keys or bounds) of the selecting layers from a prefilled `SpecCache` (rows hold
        ``pad <= slot < length``)."""
        if self.cfg.schedule == "shared_window":
            self._reset_drafts(pad.shape[0], pad.device)
        build = build_block_bounds if self.cfg.score == "bounds" else build_block_summaries
        for layer in self.selecting_layers():
            keys = cache.layers[layer].keys
            fresh = build(keys, pad.to(keys.device), length.to(keys.device), self.cfg.block_size)
            if layer in self.mean_key:  # in place: verify graphs captured in an earlier call read this tensor
                self.mean_key[layer].copy_(fresh)
            else:
                self.mean_key[layer] = fresh

    def drafted(self, counts: torch.Tensor) -> None:
        """Each row's drafted tokens in the coming verify step (``[B]``): ``"shared_window"`` averages the scores of
        the row's real verify tokens only (the pending token and its drafts, not the filler after a short draft)."""
        kept = self.drafts.get(counts.shape[0])
        if kept is not None:
            kept.copy_(counts)

    def _reset_drafts(self, batch: int, device: torch.device) -> None:
        """Every verify token real until `drafted` says otherwise (a step driven without it: the quality harness);
        the tensor is kept per batch, so graphs captured in an earlier call read the same one."""
        kept = self.drafts.get(batch)
        if kept is None or kept.device != device:
            kept = self.drafts[batch] = torch.empty(batch, dtype=torch.int64, device=device)
        kept.fill_(1 << 30)

    def _window_weights(self, batch: int, q_len: int, device: torch.device) -> torch.Tensor:
        """``[B, q]`` float32: each verify token's weight in its row's ``"shared_window"`` score (1 / the row's real
        tokens for the pending token and its drafts, 0 for filler)."""
        positions = torch.arange(q_len, device=device)[None, :]  # [1, q]
        drafts = self.drafts.get(batch)
        last = drafts.to(device)[:, None] if drafts is not None else positions.new_full((batch, 1), q_len)
        real = positions <= last  # [B, q]
        return real.float() / real.sum(dim=1, keepdim=True).float()

    # --------------------------------------------------------------------------------------------- selection
    def _window(self, view, k_max: int) -> tuple[torch.Tensor, ...]:
        """The step's selection frame, shared by every selecting layer on this device (memoized on the step's
        `DeviceView`), all ``[B]`` int64: the candidate blocks ``[lo, hi)`` (after the sink block, before the first
        block of the new tokens: the kernel adds those itself), how many of them to pick (the budget less the
        forced blocks, at most the candidates and ``k_max``) and how many of the last candidates are the local
        blocks, picked first."""
        key = ("sparse_verify_window", k_max)
        frame = view.extra.get(key)
        if frame is None:
            bs, q_len = self.cfg.block_size, view.step.q_len
            first_new = view.start.long() // bs
            lo = view.pad.long() // bs + 1
            candidates = (first_new - lo).clamp_min(0)
            forced = 1 + ((view.start.long() + q_len - 1) // bs - first_new + 1)
            length = view.start.long() + q_len - view.pad.long()  # tokens of each row after this step
            count = (row_budget(self.cfg, length) - forced).clamp_min(0)
            count = torch.minimum(count, candidates).clamp_max(k_max)
            local = torch.minimum(candidates.clamp_max(self.cfg.local_blocks), count)
            frame = (lo, torch.maximum(first_new, lo), count, local)
            view.extra[key] = frame
        return frame

    def _select(self, query, key, mean_key, view) -> tuple:
        """Block lists of one selecting layer: score every block's mean key against the schedule's query rows
        (``score_blocks``), then the top blocks of each (row, KV head, query row) in ascending order
        (``topk_slots``: a radix select, no sort). Two launches on the GPU, the PyTorch references elsewhere."""
        cfg, q_len = self.cfg, view.step.q_len
        summaries = mean_key[0] if cfg.score == "bounds" else mean_key  # [B, H_kv, NB, D] (the shape counts)
        batch, h_kv, nb = summaries.shape[0], summaries.shape[1], summaries.shape[2]
        k_max = max(1, min(nb, cfg.budget_blocks(key.shape[2])))
        lo, hi, count, local = self._window(view, k_max)
        # the scoring query rows [B, H, R, D]: strided views (slices, no index tensor), or one weighted mean row
        weights = None
        if cfg.schedule == "shared_window" and q_len > 1:  # [B, q], shared by the device's selecting layers
            weights = view.extra.get("shared_window_weights")
            if weights is None:
                weights = view.extra["shared_window_weights"] = self._window_weights(batch, q_len, query.device)
        if weights is not None and cfg.score == "mean":
            # the mean of the window's scores q_t . m is the score of the window's mean query: one row, one batched
            # matmul per selecting layer ([B, 1, 1, q] @ [B, H, q, D]; the weights cast once per step)
            cast = view.extra.get(("shared_window_weights", query.dtype))
            if cast is None:
                cast = view.extra[("shared_window_weights", query.dtype)] = weights[:, None, None, :].to(query.dtype)
            rows = torch.matmul(cast, query)
        elif cfg.schedule in ("exact_merged", "shared_window") and q_len > 1:
            rows = query
        elif cfg.schedule == "approx_shared" and q_len > cfg.group_size:
            rows = query[:, :, :: cfg.group_size]  # each group's first token
        else:
            rows = query[:, :, :1]  # one selection for the row: its first verify token's
        r = rows.shape[2]
        # [R, B, H, D] query rows against [R, B, H_kv, NB, D] (a stride-0 view of the summaries)
        q_rows = rows.permute(2, 0, 1, 3)
        # length = start: every candidate block lies before the new tokens (blocks past it are never picked)
        if cfg.score == "bounds":
            scores = score_block_bounds(q_rows, mean_key, view.pad, view.start, cfg.block_size)
        else:
            scores = score_blocks(
                q_rows, mean_key.expand(r, *mean_key.shape), view.pad, view.start, cfg.block_size
            )
        if weights is not None and r > 1:  # bounds: each verify token's score, then their weighted mean
            finite = torch.isfinite(scores[:1])  # [1, B, H_kv, NB]: blocks without a valid slot are -inf for all
            summed = (torch.where(torch.isfinite(scores), scores, 0.0) * weights.t()[:, :, None, None]).sum(0, True)
            scores, r = torch.where(finite, summed, float("-inf")), 1
        # topk_slots ranks [N, B, NB]: N = R x H_kv selections per batch row
        ranked = scores.permute(0, 2, 1, 3).reshape(r * h_kv, batch, nb)
        picked = topk_slots(ranked, lo, hi, count, k_max, recent=local)  # [R * H_kv, B, k_max]
        index = picked.view(r, h_kv, batch, k_max).permute(2, 1, 0, 3)  # [B, H_kv, R, k_max]
        counts = count[:, None, None].expand(batch, h_kv, r)
        if r == 1:
            return index[:, :, 0], counts[:, :, 0], None
        if cfg.schedule == "approx_shared":  # every query takes its group's representative's blocks
            group = torch.arange(q_len, device=query.device) // cfg.group_size
            index, counts = index[:, :, group], counts[:, :, group]
        return merge_query_blocks(index, counts, nb)

    # ------------------------------------------------------------------------------------------------ attend
    def attend(self, module, query, key, value, view, scaling: float) -> torch.Tensor | None:
        """Block-sparse output ``[B, q, H, D]`` of layer ``module.layer_idx``; None where it runs dense (record
        mode, or a layer without summaries whose anchor made no selection in this forward)."""
        layer = module.layer_idx
        source = self.source[layer]
        selection = self._selection.get(source) if source != layer else None
        if selection is None:
            mean_key = self.mean_key.get(layer)
            if mean_key is None:
                return None
            update = update_block_bounds if self.cfg.score == "bounds" else update_block_summaries
            update(key, mean_key, view.pad, view.start, view.step.q_len, self.cfg.block_size)
            selection = self._select(query, key, mean_key, view)
            self._selection[layer] = selection
            if self.record:
                # [B, H_kv, NB]: the blocks of the selection (the union over queries for merged schedules)
                self.recorded[layer] = selected_block_mask(selection[0], selection[1], mean_key.shape[-2])[
                    :, :, 0
                ]
        if self.record:
            return None
        index, count, query_mask = (t.to(query.device) if t is not None else None for t in selection)
        return block_sparse_attention(
            query,
            key,
            value,
            view.start,
            view.pad,
            index,
            count,
            block_size=self.cfg.block_size,
            scale=scaling,
            query_mask=query_mask,
        )
