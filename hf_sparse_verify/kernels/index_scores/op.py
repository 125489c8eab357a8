"""``hsv::index_scores``: validation, registration with ``torch.library`` (opaque to graph capture), the Triton kernel
where Triton runs (CUDA, or CPU under ``TRITON_INTERPRET=1``), the reference elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import index_scores_naive

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("hsv::index_scores", mutates_args=())
def _index_scores_op(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    if triton_runs_on(q.device) and q.dtype in _FLOATS and keys.dtype == q.dtype:
        from .kernel import index_scores_triton

        return index_scores_triton(q, keys, weights, scale)
    return index_scores_naive(q, keys, weights, scale)


@_index_scores_op.register_fake
def _(q, keys, weights, scale):
    return q.new_empty((q.shape[0], q.shape[1], keys.shape[1]), dtype=torch.float32)


def index_scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """The scores a DSA indexer ranks cached tokens by (`naive.index_scores_naive`).

    Args:
        q: ``[B, S, H, D]`` the indexer's rotated queries.
        keys: ``[B, L, D]`` its cached keys (any strides; a view of the first ``L`` slots of a cache buffer).
        weights: ``[B, S, H]`` per-head weights (float32 or castable).
        scale: the dot-product scale.

    Returns:
        float32 ``[B, S, L]``.
    """
    if q.dim() != 4 or keys.dim() != 3 or weights.shape != q.shape[:3]:
        raise ValueError(
            f"index_scores takes q [B, S, H, D], keys [B, L, D] and weights [B, S, H]; got {tuple(q.shape)}, "
            f"{tuple(keys.shape)} and {tuple(weights.shape)}"
        )
    if keys.shape[0] != q.shape[0] or keys.shape[2] != q.shape[3]:
        raise ValueError(f"keys {tuple(keys.shape)} do not match q {tuple(q.shape)} in batch or head size")
    return _index_scores_op(q, keys, weights.float(), float(scale))
