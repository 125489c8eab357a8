"""KV selection for self-speculative drafting: which cached tokens a draft step may attend to.

Every selection is per row and per layer, shared by all heads of the layer, and covers the *prefix* slots
``[pad, recent_start)``; slots ``>= recent_start`` (the tokens appended since the selection was made) are always
attended. Selections are boolean masks ``[B, L]`` over cache slots. Pure functions, no host synchronisation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class SparseLayerState:
    """What one layer's attention reads and writes for self-speculative drafting.

    Attributes:
        collect: which verify/prefill query rows to reduce into ``scores``: ``"two_rows"`` (first and last row
            of the step, Vegas' Collect-2-Query), ``"all_rows"``, ``"per_row"`` (keep every row, ``[B, q, L]``),
            ``"last_rows"`` (the last few rows of a prefill, to seed the first selection), or None.
        scores: written by the attention: head-averaged raw logits ``q . k * scale``, ``[B, L]`` (``[B, q, L]`` for
            ``"per_row"``), over the slots ``[0, kv_len)`` of that step.
        selected: ``[B, capacity]`` bool, prefix slots a draft step may attend to; None = dense drafting.
        recent_start: ``[B]`` int64, slots ``>= recent_start`` are always attended by draft steps.
        prefix_end: host-side ``max(recent_start)``: the prefix is inside slots ``[0, prefix_end)``.
        quest_budget: for Quest, ``[B]`` pages to select per row at every draft step (None: not Quest), and
            ``quest_budget_max`` its host-side maximum.
        page_size: Quest page size.
        page_min / page_max: Quest per-page key summaries ``[B, H_kv, pages, D]``, built on first use after a
            verify step and reused by the following draft steps.
        index / index_valid / index_count: the selection as slot indices ``[B, k_max]`` (ascending), which of
            them are real (rows may keep fewer than ``k_max``) and how many per row ``[B]``; gather-based
            backends and the token-sparse kernel read these instead of ``selected``.
        recent_min: host-side ``min(recent_start)``.
        static_buffers: in CUDA-graph mode, the fixed tensors behind ``index``, ``index_valid``, ``index_count``
            and ``recent_start`` (a captured draft step reads them; new selections are copied in).
    """

    collect: str | None = None
    scores: torch.Tensor | None = None
    selected: torch.Tensor | None = None
    recent_start: torch.Tensor | None = None
    prefix_end: int = 0
    quest_budget: torch.Tensor | None = None
    quest_budget_max: int = 0
    page_size: int = 16
    page_min: torch.Tensor | None = None
    page_max: torch.Tensor | None = None
    index: torch.Tensor | None = None
    index_valid: torch.Tensor | None = None
    index_count: torch.Tensor | None = None
    recent_min: int = 0
    static_buffers: tuple | None = None


PREFILL_SEED_ROWS = 8


def budget(prefix_len: int, ratio: float, min_tokens: int) -> int:
    """Tokens kept for a prefix of ``prefix_len`` tokens: ``max(min_tokens, ceil(ratio * prefix_len))``."""
    # round first: 0.07 * 100 is 7.000000000000001 in floating point
    return max(min_tokens, math.ceil(round(ratio * prefix_len, 9)))


def prefix_valid(pad: torch.Tensor, recent_start: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, length]`` bool: slot in ``[pad, recent_start)``."""
    slots = torch.arange(length, device=pad.device)
    return (slots[None, :] >= pad[:, None]) & (slots[None, :] < recent_start[:, None])


def select_topk(
    scores: torch.Tensor, pad: torch.Tensor, recent_start: torch.Tensor, budgets: list[int], capacity: int
) -> torch.Tensor:
    """Per row, the ``budgets[b]`` prefix slots with the highest score (all of them when the prefix is shorter).

    Args:
        scores: ``[B, L]`` per-slot scores (``L >= max(recent_start)``).
        pad, recent_start: ``[B]`` prefix bounds.
        budgets: host list of tokens to keep per row.
        capacity: width of the returned mask.

    Returns:
        ``[B, capacity]`` bool.

    Example:
        >>> s = torch.tensor([[0.1, 0.9, 0.3, 0.8, 0.5]])
        >>> select_topk(s, torch.tensor([0]), torch.tensor([4]), [2], 5).int().tolist()
        [[0, 1, 0, 1, 0]]
    """
    batch, length = scores.shape
    valid = prefix_valid(pad, recent_start, length)
    masked = scores.float().masked_fill(~valid, float("-inf"))
    k = min(max(budgets), length)
    top = masked.topk(k, dim=1).indices  # [B, k], best first
    keep = (
        torch.arange(k, device=scores.device)[None, :] < torch.tensor(budgets, device=scores.device)[:, None]
    )
    selected = torch.zeros(batch, capacity, dtype=torch.bool, device=scores.device)
    selected.scatter_(1, top, keep)
    selected[:, :length] &= valid
    return selected


def mask_to_index(selected: torch.Tensor, k_max: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slot indices of a ``[B, C]`` selection mask: ``index`` ``[B, k_max]`` ascending (unused entries point at
    slot 0) and ``valid`` ``[B, k_max]``. ``k_max`` must be >= the largest row count (host-side bound).

    Example:
        >>> index, valid = mask_to_index(torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0]]).bool(), 2)
        >>> index.tolist(), valid.tolist()
        ([[1, 3], [0, 0]], [[True, True], [True, False]])
    """
    capacity = selected.shape[1]
    k_max = min(k_max, capacity)
    # ascending slots of the selected entries first: key = slot for selected, capacity + slot otherwise
    slots = torch.arange(capacity, device=selected.device)
    order = torch.where(selected, slots, slots + capacity)
    index = order.topk(k_max, dim=1, largest=False).values
    valid = index < capacity
    return torch.where(valid, index, torch.zeros_like(index)), valid


def select_streaming(
    pad: torch.Tensor, recent_start: torch.Tensor, budgets: list[int], sinks: int, capacity: int
) -> torch.Tensor:
    """StreamingLLM: the first ``sinks`` prefix tokens and the most recent ``budget - sinks`` ones."""
    slots = torch.arange(capacity, device=pad.device)[None, :]
    keep_recent = torch.tensor([max(0, b - sinks) for b in budgets], device=pad.device)[:, None]
    valid = prefix_valid(pad, recent_start, capacity)
    sink = slots < pad[:, None] + sinks
    recent = slots >= recent_start[:, None] - keep_recent
    return valid & (sink | recent)


def head_mean_logits(query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """Raw logits ``q . k * scale`` averaged over query heads: ``[B, q, L]`` from ``query`` ``[B, H, q, D]`` and
    ``key`` ``[B, H_kv, L, D]`` (GQA: each KV head serves ``H / H_kv`` query heads)."""
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.float().view(batch, kv_heads, heads // kv_heads, q_len, dim).mean(dim=2)  # [B, Hkv, q, D]
    # mean over heads commutes with the dot product: average the grouped queries first, then one matmul
    logits = torch.matmul(grouped, key.float().transpose(-1, -2))  # [B, Hkv, q, L]
    return logits.mean(dim=1) * scaling


def page_summaries(key: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest key summaries: per page of ``page_size`` slots, the elementwise min and max key ``[B, H_kv, P, D]``."""
    batch, kv_heads, length, dim = key.shape
    pages = math.ceil(length / page_size)
    extra = pages * page_size - length  # a partial last page: its padding must not enter the min / max

    def reduce(fill: float, op) -> torch.Tensor:
        padded = torch.nn.functional.pad(key.float(), (0, 0, 0, extra), value=fill)
        return op(padded.view(batch, kv_heads, pages, page_size, dim), dim=3)

    return reduce(float("inf"), torch.amin), reduce(float("-inf"), torch.amax)


def select_quest(
    query: torch.Tensor,
    page_min: torch.Tensor,
    page_max: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    pages_budget: torch.Tensor,
    pages_budget_max: int,
    page_size: int,
    capacity: int,
) -> torch.Tensor:
    """Quest (Tang et al., 2024) page selection for one draft query, shared by the heads of the layer.

    Page score: ``sum_d max(q_d * min_d, q_d * max_d)`` (an upper bound of ``q . k`` on the page), summed over
    query heads. Pages wholly outside the prefix score ``-inf``.

    Args:
        query: ``[B, H, 1, D]``; page_min/page_max: ``[B, H_kv, P, D]``; pages_budget: ``[B]`` pages to keep
        (host-side maximum ``pages_budget_max``).

    Returns:
        ``[B, capacity]`` bool over slots.
    """
    batch, heads, _, dim = query.shape
    kv_heads, pages = page_min.shape[1], page_min.shape[2]
    q = query.float().view(batch, kv_heads, heads // kv_heads, dim)  # one query row
    upper = torch.maximum(
        q[:, :, :, None, :] * page_min[:, :, None], q[:, :, :, None, :] * page_max[:, :, None]
    )
    page_scores = upper.sum(dim=-1).sum(dim=(1, 2))  # [B, P]
    first = torch.arange(pages, device=query.device) * page_size
    inside = (first[None, :] + page_size > pad[:, None]) & (first[None, :] < recent_start[:, None])
    page_scores = page_scores.masked_fill(~inside, float("-inf"))
    k = min(pages, pages_budget_max)
    top = page_scores.topk(k, dim=1).indices  # [B, k]
    keep = torch.arange(k, device=query.device)[None, :] < pages_budget[:, None]
    chosen = torch.zeros(batch, pages, dtype=torch.bool, device=query.device).scatter_(1, top, keep)
    slots = chosen.repeat_interleave(page_size, dim=1)[:, :capacity]
    if slots.shape[1] < capacity:
        slots = torch.nn.functional.pad(slots, (0, capacity - slots.shape[1]))
    return slots & prefix_valid(pad, recent_start, capacity)
