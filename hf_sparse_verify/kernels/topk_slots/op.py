"""Public per-row top-k slot selection, registered as ``hsv::topk_slots`` (opaque to graph capture and compile)."""

from __future__ import annotations

import torch

from .._triton import compiled_on
from .naive import topk_slots_naive


@torch.library.custom_op("hsv::topk_slots", mutates_args=())
def _topk_slots_op(
    scores: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    count: torch.Tensor,
    k_slots: int,
    recent: torch.Tensor | None,
    pool: int,
    kernel: bool,
) -> torch.Tensor:
    if kernel:
        from .kernel import topk_slots_triton

        return topk_slots_triton(scores, pad, recent_start, count, k_slots, recent, pool)
    return topk_slots_naive(scores, pad, recent_start, count, k_slots, recent, pool)


@_topk_slots_op.register_fake
def _(scores, pad, recent_start, count, k_slots, recent, pool, kernel):
    return scores.new_empty(scores.shape[0], scores.shape[1], k_slots, dtype=torch.int64)


def _check(scores, pad, recent_start, count, k_slots, recent, pool) -> None:
    if scores.dim() != 3 or not scores.dtype.is_floating_point:
        raise ValueError(f"scores must be a float [N, B, L] tensor, got {scores.dtype} {tuple(scores.shape)}")
    layers, batch, length = scores.shape
    for name, t in (("pad", pad), ("recent_start", recent_start), ("count", count), ("recent", recent)):
        if t is not None and (t.shape != (batch,) or t.dtype != torch.int64 or t.device != scores.device):
            raise ValueError(
                f"{name} must be int64 [B] = [{batch}] on {scores.device}, got {t.dtype} {tuple(t.shape)} on "
                f"{t.device}"
            )
    if not 1 <= k_slots <= length:
        raise ValueError(f"k_slots must be in [1, L] = [1, {length}], got {k_slots}")
    if pool < 1 or pool % 2 != 1:
        raise ValueError(f"pool must be odd (centred on the slot), got {pool}")


def topk_slots(
    scores: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    count: torch.Tensor,
    k_slots: int,
    recent: torch.Tensor | None = None,
    pool: int = 1,
    kernel: bool | None = None,
) -> torch.Tensor:
    """Per layer and row, the ``count[b]`` prefix slots of ``[pad[b], recent_start[b])`` with the highest score,
    ascending, in ``k_slots`` columns (unused columns hold 0). Ties rank the lower slot first.

    Args:
        scores: ``[N, B, L]`` float (N layers; the last axis contiguous), ``L >= max(recent_start)``.
        pad, recent_start, count: ``[B]`` int64 (``count <= recent_start - pad``, ``count <= k_slots``).
        k_slots: output columns.
        recent: ``[B]`` int64 (``<= count``): the last ``recent[b]`` prefix slots are always kept.
        pool: odd max-pooling width: a slot ranks by the best score within ``pool // 2`` prefix slots either side
            (SnapKV's pooling: the selection keeps short spans around the important tokens).
        kernel: run the Triton kernel; default: where it is compiled (CUDA), the PyTorch reference elsewhere.

    Returns:
        ``[N, B, k_slots]`` int64.

    Example:
        >>> s = torch.tensor([[[0.1, 0.9, 0.3, 0.8, 0.5]]])
        >>> topk_slots(s, torch.tensor([0]), torch.tensor([4]), torch.tensor([2]), 3).tolist()
        [[[1, 3, 0]]]
    """
    _check(scores, pad, recent_start, count, k_slots, recent, pool)
    if kernel is None:
        kernel = compiled_on(scores.device)
    return _topk_slots_op(scores, pad, recent_start, count, k_slots, recent, pool, kernel)
