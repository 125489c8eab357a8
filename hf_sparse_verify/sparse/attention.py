"""Block-sparse verify attention (LOSSY): papers/000 §3.1-3.3 with papers/003's grouped schedules.

Per verify step and layer, each (row, KV head) attends to a set of KV blocks of `SparseAttention.block_size` slots:

- forced (the kernel adds them itself): the sink block (holding the row's first real token) and the blocks
  holding the new tokens;
- the ``local_blocks`` blocks right before the new tokens (scored +inf, so always picked);
- the top-scoring other blocks, up to the row's budget (§3.2: every block while the row holds at most
  ``dense_below`` tokens, else ``((L - dense_below) * rho + dense_below) / block_size`` blocks, forced ones included).

A block's score (Eq. 5) is the query against the block's mean key, summed over the query heads of the KV head (the
GQA group shares one selection). Which query scores depends on the schedule: the row's first verify token for
every verify token (``"shared"``), the first token of each group of ``group_size`` (``"approx_shared"``) or every
token for itself (``"exact_merged"``: the union is loaded once by the kernel and masked per query).

Mean keys are kept per layer (`build` after the prefill, then refreshed in place inside every verify step from the
keys the step wrote, so they follow rollbacks: blocks past a row's length are never scored). Layers that reuse an
anchor's selection (§3.3) keep no summaries and score nothing.

Everything runs on the device from fixed tensors and shapes: no host sync, capturable in the verify graphs.
"""

from __future__ import annotations

import torch

from ..kernels.block_sparse import block_sparse_attention, merge_query_blocks
from ..kernels.block_sparse.naive import selected_block_mask
from ..kernels.block_summary import build_block_summaries, update_block_summaries
from ..kernels.block_summary.naive import num_blocks
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
        self.mean_key: dict[int, torch.Tensor] = {}
        self.record = record
        self.recorded: dict[int, torch.Tensor] = {}  # layer -> [B, H_kv, NB] bool (record mode)
        self._selection: dict[int, tuple] = {}  # layer -> its selection in the running forward

    def selecting_layers(self) -> list[int]:
        return sorted(set(self.source))

    def build(self, cache, pad: torch.Tensor, length: torch.Tensor) -> None:
        """Mean keys of the selecting layers from a prefilled `SpecCache` (rows hold ``pad <= slot < length``)."""
        for layer in self.selecting_layers():
            keys = cache.layers[layer].keys
            fresh = build_block_summaries(
                keys, pad.to(keys.device), length.to(keys.device), self.cfg.block_size
            )
            if layer in self.mean_key:  # in place: verify graphs captured in an earlier call read this tensor
                self.mean_key[layer].copy_(fresh)
            else:
                self.mean_key[layer] = fresh

    # --------------------------------------------------------------------------------------------- selection
    def _block_masks(self, view, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(drop [B, NB], local [B, NB])`` bool, shared by every layer of the step on this device (memoized on
        the step's `DeviceView`): blocks outside the row's valid range or forced (the kernel adds those), and the
        local blocks before the new tokens."""
        key = ("sparse_verify_blocks", nb)
        masks = view.extra.get(key)
        if masks is None:
            bs = self.cfg.block_size
            blocks = torch.arange(nb, device=view.device)
            first_new = (view.start // bs)[:, None]
            last_new = ((view.start + view.step.q_len - 1) // bs)[:, None]
            sink = (view.pad // bs)[:, None]
            valid = (blocks >= sink) & (blocks <= last_new)  # [B, NB]
            forced = (blocks == sink) | (blocks >= first_new)
            local = (blocks < first_new) & (blocks >= first_new - self.cfg.local_blocks) & valid & ~forced
            masks = (~valid | forced, local)
            view.extra[key] = masks
        return masks

    def _scores(self, query, mean_key, view, q_rows: torch.Tensor | None) -> torch.Tensor:
        """``[B, H_kv, R, NB]`` float32 scores of the query rows ``q_rows`` ``[R]`` (None: row 0); blocks outside
        a row's valid range are ``-inf``, the forced blocks ``-inf`` (the kernel adds them), the local blocks
        ``+inf``."""
        b, h, _, d = query.shape
        h_kv, nb = mean_key.shape[1], mean_key.shape[2]
        rows = query[:, :, :1] if q_rows is None else query[:, :, q_rows]
        grouped = rows.float().reshape(b, h_kv, h // h_kv, rows.shape[2], d).sum(2)
        scores = torch.einsum("bgrd,bgnd->bgrn", grouped, mean_key)  # [B, H_kv, R, NB]
        drop, local = self._block_masks(view, nb)
        scores = scores.masked_fill(local[:, None, None], float("inf"))
        return scores.masked_fill(drop[:, None, None], float("-inf"))

    def _top(self, scores: torch.Tensor, keep: torch.Tensor, k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top ``keep[b]`` blocks per (row, head, query row): ``[B, H_kv, R, k_max]`` ascending ids, counts."""
        k = min(k_max, scores.shape[-1])
        values, ids = scores.topk(k, dim=-1)
        rank = torch.arange(k, device=scores.device)
        valid = (rank < keep[:, None, None, None]) & (values > float("-inf"))
        nb = scores.shape[-1]
        ids = torch.where(valid, ids, nb).sort(dim=-1).values
        count = valid.sum(-1)
        return torch.where(ids < nb, ids, 0).to(torch.int32), count.to(torch.int32)

    def _select(self, query, key, mean_key, view) -> tuple:
        cfg, q_len = self.cfg, view.step.q_len
        bs, capacity = cfg.block_size, key.shape[2]
        nb = num_blocks(capacity, bs)
        keep = view.extra.get("sparse_verify_keep")
        if keep is None:  # [B] blocks picked besides the forced ones (one per step, shared by the layers)
            length = view.start + q_len - view.pad  # tokens of each row after this step
            forced = 1 + ((view.start + q_len - 1) // bs - view.start // bs + 1)
            keep = (row_budget(cfg, length) - forced).clamp_min(0)
            view.extra["sparse_verify_keep"] = keep
        k_max = max(1, min(nb, cfg.budget_blocks(capacity)))
        if cfg.schedule == "exact_merged" and q_len > 1:
            rows = torch.arange(q_len, device=query.device)
        elif cfg.schedule == "approx_shared" and q_len > cfg.group_size:
            rows = torch.arange(0, q_len, cfg.group_size, device=query.device)
        else:
            rows = None  # one selection for the row: its first verify token's
        index, count = self._top(self._scores(query, mean_key, view, rows), keep, k_max)  # [B, H_kv, R, k]
        if rows is None:
            return index[:, :, 0], count[:, :, 0], None
        if cfg.schedule == "approx_shared":  # every query takes its group's representative's blocks
            group = torch.arange(q_len, device=query.device) // cfg.group_size
            index, count = index[:, :, group], count[:, :, group]
        return merge_query_blocks(index, count, nb)

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
            update_block_summaries(key, mean_key, view.pad, view.start, view.step.q_len, self.cfg.block_size)
            selection = self._select(query, key, mean_key, view)
            self._selection[layer] = selection
            if self.record:
                # [B, H_kv, NB]: the blocks of the selection (the union over queries for merged schedules)
                self.recorded[layer] = selected_block_mask(selection[0], selection[1], mean_key.shape[2])[
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
