"""Reference of ``hsv::expert_skip`` (plain PyTorch, imports only torch): how many routed experts each token keeps
under expert skipping in verify (sparse verification paper, §3.5), and in which order.

Reading of the paper. §3.5 sorts a token's ``k`` routing weights ascending, ``w_1 <= .. <= w_k``, and writes the
calibration ratio (Eq. 15) and the skip test (Eq. 16) over ``sum_{j <= k-m} w_j``: the LOWEST ``k - m`` weights.
Taken literally that is not the weight of the experts it then skips (the ``i`` lowest, ``e_1 .. e_i``), and for
``k = 2`` it does not reduce to the rule it generalises (Lu et al. 2024: skip the second expert when its weight is
small against the first). We read both equations over the experts that are skipped:

- ``r_m`` = share of the token's routing weight held by its ``m`` lowest-weight experts,
  ``sum_{j <= m} w_j / sum_j w_j`` (= 1 - the share of its top ``k - m``, the descending-order reading of Eq. 15);
- calibration: ``beta_m`` = median of ``r_m`` over the calibration tokens of the layer, ``m = 1 .. k-1``;
- inference: skip the ``i`` lowest-weight experts for the largest ``i`` in ``1 .. max_skip`` with
  ``r_i < beta_i`` (Eq. 16 with ``beta_i`` where the paper prints ``beta_m``: the map holds one threshold per skip
  size), none when no ``i`` passes. So a token skips ``i`` experts when those experts hold less of its weight than
  they do for the median calibration token.

The kept experts' weights are NOT renormalised: the paper says nothing of it and Lu et al. skip without it, so a
kept expert contributes exactly what it does in the dense pass (also what the fused op does with ``n_active``).

Shares are computed in float32 from the weights the router hands the experts (after its own top-k normalisation,
where the model has one).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_TINY = 1e-30


class SkipRule(NamedTuple):
    """A layer's skip rule. The functions here read only these three attributes, so the step slot
    `hf_sparse_verify.step.MoESkip` (which has them) is accepted as well.

    Attributes:
        rule: ``"threshold"`` (``values`` ``[k - 1]``: ``beta_1 .. beta_{k-1}``), ``"budget"`` (``values`` ``[]``:
            the share of routing weight kept) or ``"row_union"`` (``values`` ``[]``: experts per row kept).
        max_skip: at most this many of a token's ``k`` routed experts are skipped.
        values: float tensor, as the rule says.
    """

    rule: str
    max_skip: int
    values: torch.Tensor


def order_by_weight(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts sorted by routing weight, highest first (stable: ties keep their order, and an already
    sorted row is returned unchanged), so that "the first ``n_active``" of `skip_counts` are the kept experts.

    Args:
        top_k_index: ``[T, k]`` expert ids.
        top_k_weights: ``[T, k]`` routing weights.

    Returns:
        ``(index [T, k], weights [T, k])``, same dtypes.

    Example:
        >>> order_by_weight(torch.tensor([[3, 1, 2]]), torch.tensor([[0.2, 0.5, 0.3]]))
        (tensor([[1, 2, 3]]), tensor([[0.5000, 0.3000, 0.2000]]))
    """
    weights, order = torch.sort(top_k_weights, dim=-1, descending=True, stable=True)
    return torch.gather(top_k_index, -1, order), weights


def _shares(top_k_weights: torch.Tensor, descending: bool) -> torch.Tensor:
    """``[T, k]`` float32 cumulative shares: entry ``j`` is the share of the ``j + 1`` lowest (or highest) weights."""
    w = top_k_weights.float()
    w = torch.sort(w, dim=-1, descending=descending).values
    return torch.cumsum(w, dim=-1) / w.sum(dim=-1, keepdim=True).clamp_min(_TINY)


def skip_counts(top_k_weights: torch.Tensor, skip) -> torch.Tensor:
    """How many of its ``k`` routed experts each token keeps under ``skip`` (no host sync; capturable).

    Rules (``m = min(skip.max_skip, k - 1)``; shares of the token's summed top-k weight, see the module docstring):

    - ``"threshold"`` (``skip.values`` ``[k-1]`` = ``beta_1 .. beta_{k-1}``): skip the ``i`` lowest-weight experts
      for the largest ``i <= m`` whose share ``r_i`` is strictly under ``beta_i``; ``i = 0`` when none is.
    - ``"budget"`` (``skip.values`` ``[]`` = budget): keep the fewest highest-weight experts whose share reaches the
      budget (``>=``), and never fewer than ``k - m``.

    Tied weights: the shares do not depend on which of them is dropped; `order_by_weight` keeps the earlier one.

    Args:
        top_k_weights: ``[T, k]`` routing weights (any float dtype, any order).
        skip: the layer's rule (`SkipRule` or `MoESkip`).

    Returns:
        ``n_active`` ``[T]`` int32 in ``[k - m, k]``.

    Example:
        >>> w = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.3, 0.3]])
        >>> skip_counts(w, SkipRule("threshold", 2, torch.tensor([0.2, 0.5]))).tolist()
        [1, 3]
        >>> skip_counts(w, SkipRule("budget", 2, torch.tensor(0.85))).tolist()
        [2, 3]
    """
    tokens, k = top_k_weights.shape
    m = min(int(skip.max_skip), k - 1)
    if m < 1:
        return torch.full((tokens,), k, dtype=torch.int32, device=top_k_weights.device)
    if skip.rule == "threshold":
        low = _shares(top_k_weights, descending=False)[:, :m]  # [T, m] r_1 .. r_m
        passes = low < skip.values[:m].to(low.device, torch.float32)[None, :]
        sizes = torch.arange(1, m + 1, device=low.device, dtype=torch.int32)
        skipped = torch.where(passes, sizes, 0).amax(dim=-1)  # [T]
        return (k - skipped).to(torch.int32)
    if skip.rule == "budget":
        top = _shares(top_k_weights, descending=True)  # [T, k] share of the top 1 .. k
        budget = skip.values.to(top.device, torch.float32)
        short = (top < budget).sum(dim=-1)  # [T] how many top counts miss the budget
        return (short + 1).clamp(k - m, k).to(torch.int32)
    raise ValueError(
        f"skip_counts handles the per-token rules 'threshold' and 'budget', got {skip.rule!r} (row_union: use "
        f"`row_union`)"
    )


def row_union(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``"row_union"`` rule (ours): rows of ``group`` consecutive tokens share one expert set per layer.

    A row's set is its ``N = skip.values`` experts of highest routing weight summed over the row's tokens (ties: the
    lower expert id first). Each token keeps its routed experts in the set, and never fewer than
    ``k - m`` (``m = min(max_skip, k - 1)``): the kept experts come first in its order (set members, then the rest,
    each by weight, highest first; stable), so "the first ``n_active``" are the kept ones, as for the other rules.

    Args:
        top_k_index: ``[T, k]`` expert ids, ``T`` a multiple of ``group``.
        top_k_weights: ``[T, k]`` routing weights.
        skip: a ``"row_union"`` rule.
        group: tokens per row (the verify step's ``q_len``).

    Returns:
        ``(index [T, k], weights [T, k], n_active [T] int32)``; no host sync, capturable.

    Example:
        >>> idx = torch.tensor([[0, 1], [2, 0]])
        >>> w = torch.tensor([[0.6, 0.4], [0.7, 0.3]])
        >>> row_union(idx, w, SkipRule("row_union", 1, torch.tensor(1.0)), group=2)  # expert 0 sums 0.9
        (tensor([[0, 1],
                [0, 2]]), tensor([[0.6000, 0.4000],
                [0.3000, 0.7000]]), tensor([1, 1], dtype=torch.int32))
    """
    tokens, k = top_k_index.shape
    if group < 1 or tokens % group:
        raise ValueError(f"row_union needs T = {tokens} tokens in rows of group = {group} (a divisor of T)")
    m = min(int(skip.max_skip), k - 1)
    ids = top_k_index.reshape(tokens // group, group * k)  # [R, P]
    w = top_k_weights.float().reshape(ids.shape)
    pairs = torch.arange(group * k, device=ids.device)
    same = ids[:, :, None] == ids[:, None, :]  # [R, P, P]: pair a (dim 1) and pair b (dim 2) name one expert
    summed = torch.where(same, w[:, None, :], 0.0).sum(-1)  # [R, P]: the row's weight of pair a's expert
    first = ~(same & (pairs[None, :] < pairs[:, None])[None]).any(-1)  # [R, P]: pair a is its expert's first
    heavier = (summed[:, None, :] > summed[:, :, None]) | (
        (summed[:, None, :] == summed[:, :, None]) & (ids[:, None, :] < ids[:, :, None])
    )
    rank = (first[:, None, :] & heavier).sum(-1)  # [R, P]: experts of the row ranked above pair a's
    in_set = (rank < skip.values.to(rank.device, torch.float32)).reshape(tokens, k)
    order = torch.sort(top_k_weights.float(), dim=-1, descending=True, stable=True).indices  # by weight
    out_first = (~torch.gather(in_set, -1, order)).to(torch.uint8)  # then set members first, stable
    order = torch.gather(order, -1, torch.sort(out_first, dim=-1, stable=True).indices)
    n_active = in_set.sum(-1).clamp_min(k - m).to(torch.int32)
    return torch.gather(top_k_index, -1, order), torch.gather(top_k_weights, -1, order), n_active


def active_mask(n_active: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, k]`` bool: rank ``r`` (of `order_by_weight`'s order) is kept when ``r < n_active[t]``."""
    return torch.arange(k, device=n_active.device)[None, :] < n_active[:, None]


def expert_skip_naive(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip, group: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index [T, k], weights [T, k])`` with each token's kept experts first (in weight order, highest first,
    stable) and ``n_active [T]`` int32: `order_by_weight` then `skip_counts`, or `row_union` for that rule.
    ``skip``: a `SkipRule` (or `MoESkip`); ``group``: tokens per row, read by ``"row_union"`` only."""
    if skip.rule == "row_union":
        return row_union(top_k_index, top_k_weights, skip, group)
    index, weights = order_by_weight(top_k_index, top_k_weights)
    return index, weights, skip_counts(top_k_weights, skip)
