"""``hsv::moe_router``: validation, registration with ``torch.library``, Triton where it runs, the reference
elsewhere (CPU without ``TRITON_INTERPRET=1``, float64)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import moe_router_naive

#: the kernel keeps a row's logits in registers and picks the top-k in ``k`` rounds: these bound both
MAX_EXPERTS = 512
MAX_TOP_K = 32
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@torch.library.custom_op("hsv::moe_router", mutates_args=())
def _moe_router_op(
    hidden: torch.Tensor, weight: torch.Tensor, top_k: int, normalize: bool, scores_float32: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if triton_runs_on(hidden.device) and hidden.dtype != torch.float64:
        from .kernel import launch

        return launch(hidden, weight, top_k, normalize, scores_float32)
    logits, scores, indices = moe_router_naive(hidden, weight, top_k, normalize, scores_float32)
    return logits, scores.contiguous(), indices.contiguous()


@_moe_router_op.register_fake
def _(hidden, weight, top_k, normalize, scores_float32):
    tokens = hidden.shape[0]
    return (
        hidden.new_empty((tokens, weight.shape[0])),
        hidden.new_empty((tokens, top_k), dtype=torch.float32 if scores_float32 else hidden.dtype),
        hidden.new_empty((tokens, top_k), dtype=torch.int64),
    )


def _check(hidden: torch.Tensor, weight: torch.Tensor, top_k: int) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"moe_router needs hidden [T, H] and weight [E, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if hidden.dtype not in _FLOAT_DTYPES or weight.dtype != hidden.dtype:
        raise ValueError(
            f"hidden and weight must share one float dtype; got {hidden.dtype} and {weight.dtype} (cast the "
            "router weight to the activation dtype, as F.linear would require)"
        )
    if hidden.device != weight.device:
        raise ValueError(f"hidden and weight must be on one device; got {hidden.device} and {weight.device}")
    n_experts = weight.shape[0]
    if not 1 <= n_experts <= MAX_EXPERTS:
        raise ValueError(f"moe_router handles 1..{MAX_EXPERTS} experts, got {n_experts}")
    if not 1 <= top_k <= min(n_experts, MAX_TOP_K):
        raise ValueError(
            f"top_k must be in 1..{min(n_experts, MAX_TOP_K)} for {n_experts} experts, got {top_k}"
        )


def moe_router(
    hidden: torch.Tensor, weight: torch.Tensor, top_k: int, normalize: bool, scores_float32: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A MoE layer's top-k router in one op, as transformers' ``*TopKRouter`` modules compute it (see
    `moe_router_naive`): no host sync, grid from shapes only.

    Args:
        hidden: ``[T, H]`` token rows.
        weight: ``[E, H]`` router weight (``nn.Linear`` layout, no bias), same dtype as ``hidden``; E <= 512.
        top_k: experts per token, ``1 <= top_k <= min(E, 32)``.
        normalize: divide the top-k probabilities by their float32 sum (``norm_topk_prob``; Mixtral always).
        scores_float32: keep the scores in float32 (Mixtral) instead of casting them to ``hidden.dtype``.

    Returns:
        ``logits [T, E]`` in ``hidden.dtype`` (float32 accumulation), ``scores [T, k]`` (descending) and
        ``indices [T, k]`` int64. Among exactly equal probabilities the lower expert id comes first.

    Example:
        >>> x, w = torch.randn(3, 32), torch.randn(8, 32)
        >>> logits, scores, indices = moe_router(x, w, 2, normalize=True)
        >>> logits.shape, scores.shape, indices.dtype
        (torch.Size([3, 8]), torch.Size([3, 2]), torch.int64)
        >>> torch.allclose(scores.sum(-1), torch.ones(3))
        True
    """
    _check(hidden, weight, top_k)
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    return torch.ops.hsv.moe_router(hidden, weight, int(top_k), bool(normalize), bool(scores_float32))
