"""Reference: `hf_sparse_verify.sparse.moe.order_by_weight` then `skip_counts` (plain PyTorch)."""

from __future__ import annotations

import torch

from ...step.slots import MoESkip


def expert_skip_naive(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip: MoESkip
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index [T, k], weights [T, k])`` in weight order (highest first, stable) and ``n_active [T]`` int32."""
    from ...sparse.moe import (
        order_by_weight,
        skip_counts,
    )  # sparse.moe imports the experts code that uses this op

    index, weights = order_by_weight(top_k_index, top_k_weights)
    return index, weights, skip_counts(top_k_weights, skip)
