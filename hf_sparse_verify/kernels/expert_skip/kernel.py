"""Triton kernels of expert skipping's bookkeeping: one program per token, all ``k <= 32`` experts in registers
(per-token rules), or one program per row of ``group`` tokens, all ``group * k <= 256`` pairs in registers
(``"row_union"``).

Each expert's stable descending rank is counted from a ``[k, k]`` comparison (no sort); the row is written in rank
order; the shares the rules read are masked sums over the same comparison matrix: for the ``"budget"`` rule the
share of the ``j`` highest weights for every ``j``, for ``"threshold"`` the share of the ``i`` lowest for ``i <= m``
(`hf_sparse_verify.kernels.expert_skip.naive.skip_counts` defines both). Sums run in another order than the reference's cumulative
sums, so a share within float32 rounding of a threshold may fall on the other side of it. Grid from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait

_TINY = 1e-30


@triton.jit
def _expert_skip_kernel(
    IDS, W, VALUES, OUT_IDS, OUT_W, N_ACTIVE,
    top_k, max_skip, s_it, s_wt, s_oit, s_owt, tiny,
    BUDGET: tl.constexpr, K_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, K_BLOCK)
    ok = offs < top_k
    b_w_raw = tl.load(W + t * s_wt + offs, mask=ok, other=0.0)
    b_w = b_w_raw.to(tl.float32)
    b_ids = tl.load(IDS + t * s_it + offs, mask=ok, other=0)
    # rank[j] = experts before j in stable descending order: heavier ones, and equal ones at lower positions
    w_j, w_i = b_w[:, None], b_w[None, :]  # [K, K]: row j, column i
    before = ((w_i > w_j) | ((w_i == w_j) & (offs[None, :] < offs[:, None]))) & ok[None, :]
    rank = tl.sum(before.to(tl.int32), axis=1)  # [K]
    tl.store(OUT_IDS + t * s_oit + rank, b_ids, mask=ok)
    tl.store(OUT_W + t * s_owt + rank, b_w_raw, mask=ok)
    total = tl.maximum(tl.sum(b_w, axis=0), tiny)
    if BUDGET:
        # share of the (rank[j] + 1) highest weights, per j
        upto = (rank[None, :] <= rank[:, None]) & ok[None, :]
        top = tl.sum(tl.where(upto, w_i, 0.0), axis=1) / total
        budget = tl.load(VALUES)
        short = tl.sum(((top < budget) & ok).to(tl.int32), axis=0)
        n = tl.minimum(tl.maximum(short + 1, top_k - max_skip), top_k)
    else:
        # lane p (1 <= p <= m): share of the p lowest weights (ranks k - p .. k - 1) against beta_p
        p = offs + 1
        lowest = (rank[None, :] >= top_k - p[:, None]) & ok[None, :]
        low = tl.sum(tl.where(lowest, w_i, 0.0), axis=1) / total
        in_m = p <= max_skip
        beta = tl.load(VALUES + offs, mask=in_m, other=0.0)
        skipped = tl.max(tl.where(in_m & (low < beta), p, 0), axis=0)
        n = top_k - skipped
    tl.store(N_ACTIVE + t, n.to(tl.int32))


@triton.jit
def _row_union_kernel(
    IDS, W, VALUES, OUT_IDS, OUT_W, N_ACTIVE,
    top_k, group, min_keep, s_it, s_wt, s_oit, s_owt,
    P_BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """`hf_sparse_verify.kernels.expert_skip.naive.row_union` for one row: pair ``p`` is expert ``p % k`` of token ``p // k``; every
    quantity is a masked sum over the ``[P, P]`` comparison of the row's pairs (row a, column b)."""
    pdl_wait(PDL)
    r = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, P_BLOCK)
    ok = p < group * top_k
    tok = p // top_k
    t = r * group + tok
    j = p % top_k
    w_raw = tl.load(W + t * s_wt + j, mask=ok, other=0.0)
    w = w_raw.to(tl.float32)
    ids = tl.load(IDS + t * s_it + j, mask=ok, other=-1)
    ok_b = ok[None, :]
    same = (ids[None, :] == ids[:, None]) & ok_b
    summed = tl.sum(tl.where(same, w[None, :], 0.0), axis=1)  # the row's weight of pair a's expert
    first = tl.sum((same & (p[None, :] < p[:, None])).to(tl.int32), axis=1) == 0
    heavier = (summed[None, :] > summed[:, None]) | (
        (summed[None, :] == summed[:, None]) & (ids[None, :] < ids[:, None])
    )
    rank = tl.sum((heavier & first[None, :] & ok_b).to(tl.int32), axis=1)
    keep = (rank.to(tl.float32) < tl.load(VALUES)).to(tl.int32)
    # position in the token's order: set members first, then by weight (highest first), then by position
    same_tok = (tok[None, :] == tok[:, None]) & ok_b
    keep_a, keep_b = keep[:, None], keep[None, :]
    w_a, w_b = w[:, None], w[None, :]
    ahead = (keep_b > keep_a) | (
        (keep_b == keep_a) & ((w_b > w_a) | ((w_b == w_a) & (p[None, :] < p[:, None])))
    )
    pos = tl.sum((same_tok & ahead).to(tl.int32), axis=1)
    tl.store(OUT_IDS + t * s_oit + pos, ids, mask=ok)
    tl.store(OUT_W + t * s_owt + pos, w_raw, mask=ok)
    kept = tl.sum(tl.where(same_tok, keep_b, 0), axis=1)
    tl.store(N_ACTIVE + t, tl.maximum(kept, min_keep).to(tl.int32), mask=ok & (j == 0))


def _outputs(top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The op's outputs, uninitialised: ids and weights like the inputs, ``n_active [T]`` int32."""
    n_active = torch.empty(top_k_index.shape[0], dtype=torch.int32, device=top_k_index.device)
    return torch.empty_like(top_k_index), torch.empty_like(top_k_weights), n_active


@on_input_device
def launch_row_union(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, max_skip: int, values: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs as `expert_skip` checks them (``max_skip`` capped at ``k - 1``, ``group * k <= MAX_ROW_PAIRS``)."""
    tokens, top_k = top_k_index.shape
    out_ids, out_w, n_active = _outputs(top_k_index, top_k_weights)
    if tokens == 0:
        return out_ids, out_w, n_active
    block = max(2, next_power_of_2(group * top_k))
    _row_union_kernel[(tokens // group,)](
        top_k_index, top_k_weights, values, out_ids, out_w, n_active,
        top_k, group, top_k - max_skip,
        top_k_index.stride(0), top_k_weights.stride(0), out_ids.stride(0), out_w.stride(0),
        P_BLOCK=block, num_warps=4 if block >= 64 else 1,
        **pdl_launch(top_k_index.device),
    )  # fmt: skip
    return out_ids, out_w, n_active


@on_input_device
def launch(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, budget: bool, max_skip: int, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs as `expert_skip` checks them (``max_skip`` already capped at ``k - 1``, >= 1)."""
    tokens, top_k = top_k_index.shape
    out_ids, out_w, n_active = _outputs(top_k_index, top_k_weights)
    if tokens == 0:
        return out_ids, out_w, n_active
    _expert_skip_kernel[(tokens,)](
        top_k_index, top_k_weights, values, out_ids, out_w, n_active,
        top_k, max_skip, top_k_index.stride(0), top_k_weights.stride(0), out_ids.stride(0), out_w.stride(0), _TINY,
        BUDGET=budget, K_BLOCK=max(2, next_power_of_2(top_k)), num_warps=1,
        **pdl_launch(top_k_index.device),
    )  # fmt: skip
    return out_ids, out_w, n_active
