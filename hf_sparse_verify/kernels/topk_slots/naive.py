"""Plain-PyTorch reference of the per-row top-k slot selection (the definition the Triton kernel is tested
against): per layer and row, the ``count`` best-scoring slots of the prefix ``[pad, recent_start)``, optionally
max-pooled over neighbouring prefix slots and with the most recent prefix slots always kept, as ascending slots.
Ties rank the lower slot first (a stable descending sort), so the selection is deterministic."""

from __future__ import annotations

import torch


def prefix_valid(pad: torch.Tensor, recent_start: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, length]`` bool: slot in ``[pad, recent_start)``."""
    slots = torch.arange(length, device=pad.device)
    return (slots[None, :] >= pad[:, None]) & (slots[None, :] < recent_start[:, None])


def pool_scores(scores: torch.Tensor, pool: int) -> torch.Tensor:
    """Max of ``scores`` ``[..., L]`` over the ``pool`` slots centred on each slot (``pool`` odd; slots past either
    end count as ``-inf``).

    Example:
        >>> pool_scores(torch.tensor([[0.0, 0.0, 5.0, 0.0, 1.0, 0.0, 0.0]]), 3).tolist()
        [[0.0, 5.0, 5.0, 5.0, 1.0, 1.0, 0.0]]
    """
    if pool % 2 != 1:
        raise ValueError(f"pool must be odd (centred on the slot), got {pool}")
    flat = scores.reshape(-1, 1, scores.shape[-1])
    return torch.nn.functional.max_pool1d(flat, pool, stride=1, padding=pool // 2).view(scores.shape)


def topk_slots_naive(
    scores: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    count: torch.Tensor,
    k_slots: int,
    recent: torch.Tensor | None = None,
    pool: int = 1,
) -> torch.Tensor:
    """Per layer and row, the ``count[b]`` prefix slots with the highest score, ascending, in ``k_slots`` columns
    (unused columns hold 0). See `hf_sparse_verify.kernels.topk_slots.topk_slots` for the arguments.

    Example:
        >>> s = torch.tensor([[[0.1, 0.9, 0.3, 0.9, 0.5]]])  # slots 1 and 3 tie: the lower one ranks first
        >>> topk_slots_naive(s, torch.tensor([0]), torch.tensor([4]), torch.tensor([1]), 2).tolist()
        [[[1, 0]]]
    """
    length = scores.shape[-1]
    valid = prefix_valid(pad, recent_start, length)  # [B, L]
    fill = torch.full((1, length), float("-inf"), device=scores.device)
    ranked = scores.float()
    if pool > 1:  # neighbours outside the prefix count as -inf
        ranked = pool_scores(torch.where(valid, ranked, fill), pool)
    if recent is not None:
        slots = torch.arange(length, device=scores.device)
        window = valid & (slots[None, :] >= (recent_start - recent)[:, None])
        fill = torch.where(window, float("inf"), fill)  # the window ranks first, non-prefix slots last
        valid = valid & ~window
    ranked = torch.where(valid, ranked, fill)  # [N, B, L]
    top = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[..., :k_slots]  # best first
    keep = torch.arange(k_slots, device=scores.device)[None, :] < count[:, None]  # [B, k]
    ordered = torch.where(keep, top, length).sort(dim=-1).values  # selected slots first, ascending
    return torch.where(ordered < length, ordered, 0)
