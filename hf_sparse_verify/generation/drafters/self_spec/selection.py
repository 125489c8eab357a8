"""KV selection for self-speculative drafting: which cached prefix tokens each layer's draft steps attend to.

Every selection is per row and per layer (shared by the layer's heads) and covers the *prefix* slots
``[pad, recent_start)``; slots ``>= recent_start`` (tokens appended since the selection was made) are always
attended. Selections are kept in index form, ``index [B, k_slots]`` (ascending slots) and ``count [B]``, in fixed
buffers, so a captured draft step reads the current one. Everything here is device work without host values:
one top-k over all layers of a device, not a Python loop over layers.
"""

from __future__ import annotations

import math

import torch

from ....kernels.topk_slots import pool_scores, prefix_valid, topk_slots  # noqa: F401 (pool_scores re-exported)
from ....step import KVSelection, LayerStack


def budget(prefix_len: int, ratio: float, min_tokens: int) -> int:
    """Tokens kept for a prefix of ``prefix_len`` tokens: ``max(min_tokens, ceil(ratio * prefix_len))``."""
    # round first: 0.07 * 100 is 7.000000000000001 in floating point
    return max(min_tokens, math.ceil(round(ratio * prefix_len, 9)))


def kept_counts(prefix_len: torch.Tensor, ratio: float, min_tokens: int) -> torch.Tensor:
    """Device version of `budget`, capped at the prefix: ``min(prefix_len, budget(prefix_len))`` per row."""
    scaled = torch.round(prefix_len.double() * ratio * 1e9) / 1e9
    wanted = torch.ceil(scaled).long().clamp_min(min_tokens)
    return torch.minimum(wanted, prefix_len)


#: Vegas' selection: per layer and row, the ``count[b]`` best-scored prefix slots (with a kept recent window and
#: optional max-pooling), ascending, one op over all layers. The kernel folder's op under the name the drafters use.
topk_index = topk_slots


def streaming_index(
    pad: torch.Tensor, recent_start: torch.Tensor, count: torch.Tensor, sinks: int, k_slots: int
) -> torch.Tensor:
    """StreamingLLM: per row the first ``min(sinks, count)`` prefix slots and the ``count - sinks`` most recent
    ones, ascending, in ``k_slots`` columns (unused columns hold 0). ``[B, k_slots]``.

    Example:
        >>> streaming_index(torch.tensor([2]), torch.tensor([12]), torch.tensor([5]), 2, 6).tolist()
        [[2, 3, 9, 10, 11, 0]]
    """
    j = torch.arange(k_slots, device=pad.device)[None, :]  # [1, k]
    n_sink = count.clamp_max(sinks)[:, None]
    n_recent = count[:, None] - n_sink
    slot = torch.where(j < n_sink, pad[:, None] + j, recent_start[:, None] - n_recent + (j - n_sink))
    return torch.where(j < count[:, None], slot, 0)


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
        (host-side bound ``pages_budget_max``).

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


class IndexSelection(KVSelection):
    """Selections in index form, one per layer, in fixed buffers (Vegas, StreamingLLM)."""

    def __init__(self, devices: list[torch.device], batch: int, k_slots: int):
        self.k_slots = k_slots
        self.index = LayerStack(devices, (batch, k_slots), torch.int64)
        self.count = LayerStack(devices, (batch,), torch.int64)
        self.recent = LayerStack(devices, (batch,), torch.int64)

    def recent_start(self, layer: int) -> torch.Tensor:
        return self.recent.layer(layer)

    def gather_index(
        self, layer: int, query: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.index.layer(layer), self.count.layer(layer)

    def stacks(self) -> list[LayerStack]:
        """The fixed buffers that hold the selection."""
        return [self.index, self.count, self.recent]


def quest_index(
    query: torch.Tensor,
    page_min: torch.Tensor,
    page_max: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    pages: torch.Tensor,
    pages_max: int,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quest's pages for one draft query, as slot indices: the `select_quest` selection in the index form the
    token-sparse kernel reads (static shapes: capturable).

    The page bound ``sum_d max(q_d min_d, q_d max_d)`` is computed as ``relu(q) . max + min(q, 0) . min`` (two
    matrix products instead of a ``[B, H, P, D]`` temporary), summed over query heads.

    Args:
        query: ``[B, H, 1, D]``; page_min/page_max: ``[B, H_kv, P, D]``; pad, recent_start, pages: ``[B]``
            (pages to keep per row, ``<= pages_max``).

    Returns:
        ``index [B, pages_max * page_size]`` (selected prefix slots first, ascending; 0 after them) and
        ``count [B]``.
    """
    batch, heads, _, dim = query.shape
    kv_heads, n_pages = page_min.shape[1], page_min.shape[2]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim).to(page_max.dtype)  # one query row
    upper = torch.matmul(q.clamp_min(0), page_max.transpose(-1, -2)).float()
    upper = upper + torch.matmul(q.clamp_max(0), page_min.transpose(-1, -2)).float()  # [B, H_kv, G, P]
    page_scores = upper.sum(dim=(1, 2))  # [B, P]
    first = torch.arange(n_pages, device=query.device) * page_size
    inside = (first[None, :] + page_size > pad[:, None]) & (first[None, :] < recent_start[:, None])
    k = min(n_pages, pages_max)
    top = page_scores.masked_fill(~inside, float("-inf")).topk(k, dim=1).indices  # [B, k]
    keep = torch.arange(k, device=query.device)[None, :] < pages[:, None]
    slots = top[:, :, None] * page_size + torch.arange(page_size, device=query.device)  # [B, k, page]
    valid = keep[:, :, None] & (slots >= pad[:, None, None]) & (slots < recent_start[:, None, None])
    big = n_pages * page_size
    ordered = torch.where(valid, slots, big).flatten(1).sort(dim=1).values
    return torch.where(ordered < big, ordered, 0), valid.flatten(1).sum(dim=1)


class QuestSelection(KVSelection):
    """Quest: pages chosen inside every draft step from per-page key summaries.

    The summaries are fixed buffers. After the prefill every page is summarised; after each verify step only the
    pages the step's verified tokens fall in are recomputed: a window of ``window_pages`` pages per row from the
    page of the previous prefix end, which covers the at most ``max_draft_tokens + 1`` tokens a step adds (static
    shapes: the update is captured)."""

    def __init__(
        self, devices: list[torch.device], batch: int, page_size: int, pages_max: int, window_pages: int
    ):
        self.page_size = page_size
        self.pages_max = pages_max
        self.window_pages = window_pages
        self.recent = LayerStack(devices, (batch,), torch.int64)
        self.pages = LayerStack(devices, (batch,), torch.int64)
        self.covered = LayerStack(devices, (batch,), torch.int64)  # prefix end at the last refresh, per layer
        self.pad: dict[torch.device, torch.Tensor] = {}
        self.page_min: dict[int, torch.Tensor] = {}  # layer -> [B, H_kv, P, D], fixed buffers
        self.page_max: dict[int, torch.Tensor] = {}
        self.stale = True  # host-side: the next refresh summarises every page (set again for every new call)

    def recent_start(self, layer: int) -> torch.Tensor:
        return self.recent.layer(layer)

    def stacks(self) -> list[LayerStack]:
        """The fixed buffers that hold the selection."""
        return [self.pages, self.recent, self.covered]

    def refresh(self, layer: int, key: torch.Tensor, pad: torch.Tensor) -> None:
        """Bring layer ``layer``'s page summaries up to its prefix end ``recent_start(layer)`` from its key cache
        ``[B, H_kv, C, D]``: every page when `stale`, else the window of pages since the last refresh."""
        self.pad.setdefault(key.device, pad)
        if self.stale or layer not in self.page_min:
            low, high = page_summaries(key, self.page_size)
            if layer not in self.page_min:
                self.page_min[layer] = torch.empty_like(low, dtype=key.dtype)
                self.page_max[layer] = torch.empty_like(high, dtype=key.dtype)
            self.page_min[layer].copy_(low)
            self.page_max[layer].copy_(high)
        else:
            self._refresh_window(layer, key)
        self.covered.layer(layer).copy_(self.recent.layer(layer))

    def _refresh_window(self, layer: int, key: torch.Tensor) -> None:
        batch, kv_heads, capacity, dim = key.shape
        size, n_pages = self.page_size, self.page_min[layer].shape[2]
        width = min(self.window_pages, n_pages)
        first = (self.covered.layer(layer) // size).clamp(max=n_pages - width)  # [B] first page to redo
        pages = first[:, None] + torch.arange(width, device=key.device)  # [B, W]
        slots = (pages[:, :, None] * size + torch.arange(size, device=key.device)).flatten(1)  # [B, W * size]
        real = (slots < capacity).view(batch, 1, width, size, 1)  # a partial last page's missing slots
        index = slots.clamp_max(capacity - 1)[:, None, :, None].expand(batch, kv_heads, -1, dim)
        keys = key.gather(2, index).float().view(batch, kv_heads, width, size, dim)
        low = keys.masked_fill(~real, float("inf")).amin(dim=3)  # [B, H_kv, W, D]
        high = keys.masked_fill(~real, float("-inf")).amax(dim=3)
        where = pages[:, None, :, None].expand(batch, kv_heads, width, dim)
        self.page_min[layer].scatter_(2, where, low.to(self.page_min[layer].dtype))
        self.page_max[layer].scatter_(2, where, high.to(self.page_max[layer].dtype))

    def gather_index(
        self, layer: int, query: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if query is None:
            raise ValueError("Quest selects pages per draft query: pass the step's query")
        recent = self.recent.layer(layer)
        pad = self.pad[recent.device]
        return quest_index(
            query,
            self.page_min[layer],
            self.page_max[layer],
            pad,
            recent,
            self.pages.layer(layer),
            self.pages_max,
            self.page_size,
        )
