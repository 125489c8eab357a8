"""Reference: `hf_sparse_verify.sparse.moe.order_by_weight` then `skip_counts`, or `row_union` (plain PyTorch)."""

from __future__ import annotations

import torch

from ...step.slots import MoESkip


def expert_skip_naive(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip: MoESkip, group: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index [T, k], weights [T, k])`` with each token's kept experts first (in weight order, highest first,
    stable) and ``n_active [T]`` int32. ``group``: tokens per row, read by ``"row_union"`` only."""
    from ...sparse.moe import (
        order_by_weight,
        row_union,
        skip_counts,
    )  # sparse.moe imports the experts code that uses this op

    if skip.rule == "row_union":
        return row_union(top_k_index, top_k_weights, skip, group)

    index, weights = order_by_weight(top_k_index, top_k_weights)
    return index, weights, skip_counts(top_k_weights, skip)
