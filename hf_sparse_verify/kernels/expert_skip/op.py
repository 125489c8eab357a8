"""``hsv::expert_skip``: validation, registration with ``torch.library``, Triton where it runs, the reference
elsewhere (CPU without ``TRITON_INTERPRET=1``)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import SkipRule, expert_skip_naive, order_by_weight

#: rule name -> the op's integer code
RULES = {"threshold": 0, "budget": 1, "row_union": 2}
#: the kernel keeps a row's experts in registers and compares them pairwise
MAX_TOP_K = 32
#: ``"row_union"`` runs Triton for rows of up to this many (token, expert) pairs, the reference beyond
MAX_ROW_PAIRS = 256


@torch.library.custom_op("hsv::expert_skip", mutates_args=())
def _expert_skip_op(
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    rule: int,
    max_skip: int,
    values: torch.Tensor,
    group: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if triton_runs_on(top_k_weights.device) and top_k_weights.dtype != torch.float64:
        if rule != RULES["row_union"]:
            from .kernel import launch

            return launch(top_k_index, top_k_weights, rule == RULES["budget"], max_skip, values)
        if group * top_k_index.shape[1] <= MAX_ROW_PAIRS:
            from .kernel import launch_row_union

            return launch_row_union(top_k_index, top_k_weights, max_skip, values, group)
    name = next(n for n, code in RULES.items() if code == rule)
    index, weights, n_active = expert_skip_naive(
        top_k_index, top_k_weights, SkipRule(name, max_skip, values), group
    )
    return index.contiguous(), weights.contiguous(), n_active


@_expert_skip_op.register_fake
def _(top_k_index, top_k_weights, rule, max_skip, values, group):
    tokens = top_k_index.shape[0]
    return (
        torch.empty_like(top_k_index),
        torch.empty_like(top_k_weights),
        top_k_index.new_empty((tokens,), dtype=torch.int32),
    )


def expert_skip(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip, group: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each token's experts with the kept ones first and how many it keeps under ``skip``, in one launch: what
    `hf_sparse_verify.kernels.expert_skip.naive.order_by_weight` and `skip_counts` compute, or `row_union` for that rule (see them
    for the rules).

    Args:
        top_k_index: ``[T, k]`` int expert ids, ``k <= 32``.
        top_k_weights: ``[T, k]`` float routing weights.
        skip: the layer's rule: a `SkipRule`, or anything with its ``rule``, ``max_skip`` and ``values`` (the step
            slot `MoESkip`); ``values`` on the weights' device.
        group: tokens per row, for ``"row_union"`` (a divisor of ``T``); the other rules ignore it.

    Returns:
        ``index [T, k]`` and ``weights [T, k]`` sorted by weight (highest first; ties keep their order; under
        ``"row_union"`` the row's set members first) and ``n_active [T]`` int32 in ``[k - m, k]``
        (``m = min(max_skip, k - 1)``).

    Example:
        >>> idx, w = torch.tensor([[3, 1, 2]]), torch.tensor([[0.2, 0.5, 0.3]])
        >>> expert_skip(idx, w, SkipRule("budget", 2, torch.tensor(0.75)))
        (tensor([[1, 2, 3]]), tensor([[0.5000, 0.3000, 0.2000]]), tensor([2], dtype=torch.int32))
    """
    if top_k_index.dim() != 2 or top_k_weights.shape != top_k_index.shape:
        raise ValueError(
            f"expert_skip needs top_k_index and top_k_weights [T, k] of one shape; got {tuple(top_k_index.shape)} "
            f"and {tuple(top_k_weights.shape)}"
        )
    k = top_k_index.shape[1]
    if not 1 <= k <= MAX_TOP_K:
        raise ValueError(f"expert_skip handles 1..{MAX_TOP_K} experts per token; got {k}")
    if skip.rule not in RULES:
        raise ValueError(f"unknown skip rule {skip.rule!r}: use one of {sorted(RULES)}")
    if not top_k_weights.is_floating_point() or top_k_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"expert_skip needs int ids and float weights; got {top_k_index.dtype} and {top_k_weights.dtype}"
        )
    if skip.rule == "row_union" and (group < 1 or top_k_index.shape[0] % group):
        raise ValueError(
            f"row_union expert skipping needs the {top_k_index.shape[0]} tokens in rows of group={group} tokens "
            f"(the verify step's q_len); pass the step's q_len as group"
        )
    m = min(int(skip.max_skip), k - 1)
    values = skip.values.to(top_k_weights.device, torch.float32).reshape(-1).contiguous()
    if skip.rule == "threshold" and m >= 1 and values.numel() < m:
        raise ValueError(
            f"a threshold skip rule needs at least {m} values (beta_1 .. beta_m); got {values.numel()}"
        )
    if m < 1:  # nothing may be skipped: only the order changes
        index, weights = order_by_weight(top_k_index, top_k_weights)
        return index, weights, torch.full((top_k_index.shape[0],), k, dtype=torch.int32, device=index.device)
    return torch.ops.hsv.expert_skip(
        top_k_index.contiguous(), top_k_weights.contiguous(), RULES[skip.rule], m, values, int(group)
    )
