"""Triton fused experts for the few tokens of decode and verify steps: every selected expert's weights are read
once per block of its (token, rank) pairs, not once per pair as with ``batched_mm``.

Up to four launches, all with grids from shapes only (no host sync, CUDA-graph capturable):

1. ``_align_kernel`` (one program; only above `EXPERT_GRID_MAX_TOKENS` tokens): groups the pairs by expert into
   blocks of ``BLOCK_M`` slots. Expert ``e`` owns ``ceil(count_e / BLOCK_M)`` consecutive blocks;
   ``slot_pair[slot]`` is the pair in that slot (pairs keep token order within an expert), ``block_expert[b]`` /
   ``block_rows[b]`` the block's expert and real rows. The worst-case block count (`max_blocks`) fixes the grids;
   blocks past the real ones have 0 rows.
2. ``_gate_up_kernel``, grid ``(programs, I / BLOCK_N)``: ``h = silu(x @ gate^T) * (x @ up^T)`` for one block
   and one tile of the intermediate dimension, stored per row of ``h`` in the activation dtype.
3. ``_down_kernel``, grid ``(programs, H / BLOCK_N)``: ``y = h @ down^T``, stored per pair in float32.
4. ``_sum_kernel``, grid ``(T, H / BLOCK_H)``: each token's active pairs times their routing weights, summed in
   float32 in a fixed order (one reduction over the ranks), then cast: deterministic (no atomics). A token that
   lists one expert twice gets it twice.

Three layouts say which pairs a program of launches 2 and 3 computes (`_layout`, from shapes only):

- `PAIRS`, one token (the decode step): program ``b`` is pair ``b`` (one row, expert ``top_k_index[0, b]``; the
  distinct experts of one token need no grouping). Measured on an H200 (Qwen3-30B-A3B decode step, 48 layers): a
  variant that also folded the sum into the down kernel (grid ``H / 16``, the k pairs in a loop) took 21.5 us per
  layer against 8.8 + 2.8 us for down + sum.
- `EXPERTS`, 2 .. `EXPERT_GRID_MAX_TOKENS` tokens (verify steps): program ``e`` is expert ``e``, its row ``t`` is
  token ``t`` when one of the token's active pairs selects ``e``; each program finds its rows in the ``[T, k]`` ids
  itself, so no align launch (10-15 us per layer on the H200, a single program). Experts no pair selects return
  at once.
- `ALIGNED`, more tokens: the blocks of ``_align_kernel``.

Blocks with no rows return before loading any weight. A pair takes part when its expert id is in ``[0, E)`` and its
rank is below the token's ``n_active`` (the expert-skipping hook); every kernel applies the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: tile settings the engine uses (chosen, not yet measured on a GPU: ``benchmarks/bench_moe_experts.py --sections
#: sweep`` prints the best)
TILES = {"gate_up_n": 32, "gate_up_k": 128, "down_n": 64, "down_k": 128, "num_stages": 4, "num_warps": 4}
#: the same settings for one-token launches (decode steps: one row per block), swept on their own
#: (``bench_moe_experts.py --sections sweep1``)
TILES_ONE_TOKEN = dict(TILES)

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _pair_active(TOPK_IDS, N_ACTIVE, p, n_pairs, top_k, n_experts, HAS_N_ACTIVE: tl.constexpr):
    """Expert id of pairs ``p`` (flat ``t * top_k + rank``) and whether each takes part."""
    in_range = p < n_pairs
    e = tl.load(TOPK_IDS + p, mask=in_range, other=-1)
    ok = in_range & (e >= 0) & (e < n_experts)
    if HAS_N_ACTIVE:
        n = tl.load(N_ACTIVE + p // top_k, mask=in_range, other=0)
        ok = ok & (p % top_k < n)
    return e, ok


@triton.jit
def _pair_hits(TOPK_IDS, N_ACTIVE, p, offs_e, n_pairs, top_k, n_experts, HAS_N_ACTIVE: tl.constexpr):
    """``[CHUNK, E_BLOCK]`` int32 one-hot of each active pair's expert (all zeros for inactive pairs)."""
    e, ok = _pair_active(TOPK_IDS, N_ACTIVE, p, n_pairs, top_k, n_experts, HAS_N_ACTIVE)
    return ((e[:, None] == offs_e[None, :]) & ok[:, None]).to(tl.int32)


@triton.jit
def _align_kernel(
    TOPK_IDS, N_ACTIVE, SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS,
    n_pairs, n_blocks, top_k, n_experts,
    HAS_N_ACTIVE: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, E_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    offs_e = tl.arange(0, E_BLOCK)
    offs_c = tl.arange(0, CHUNK)
    counts = tl.zeros([E_BLOCK], dtype=tl.int32)  # active pairs per expert
    for c0 in range(0, n_pairs, CHUNK):
        counts += tl.sum(_pair_hits(TOPK_IDS, N_ACTIVE, c0 + offs_c, offs_e, n_pairs, top_k, n_experts,
                                    HAS_N_ACTIVE), axis=0)  # fmt: skip
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, axis=0)
    block_start = block_end - blocks

    for b0 in range(0, n_blocks, CHUNK):
        b = b0 + offs_c
        # the block's expert: how many experts end at or before it (E_BLOCK past the used blocks)
        expert = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        own = offs_e[None, :] == expert[:, None]  # [CHUNK, E_BLOCK]
        count = tl.sum(tl.where(own, counts[None, :], 0), axis=1)
        first = tl.sum(tl.where(own, block_start[None, :], 0), axis=1)
        valid = expert < n_experts
        rows = tl.where(valid, tl.minimum(count - (b - first) * BLOCK_M, BLOCK_M), 0)
        tl.store(BLOCK_EXPERT + b, tl.where(valid, expert, -1), mask=b < n_blocks)
        tl.store(BLOCK_ROWS + b, rows, mask=b < n_blocks)

    seen = tl.zeros([E_BLOCK], dtype=tl.int32)  # pairs of each expert in the chunks before
    for c0 in range(0, n_pairs, CHUNK):
        p = c0 + offs_c
        hits = _pair_hits(TOPK_IDS, N_ACTIVE, p, offs_e, n_pairs, top_k, n_experts, HAS_N_ACTIVE)
        rank = tl.cumsum(hits, axis=0) - hits + seen[None, :]  # rank among the expert's pairs, token order
        slot = tl.sum(hits * (block_start[None, :] * BLOCK_M + rank), axis=1)
        tl.store(SLOT_PAIR + slot, p, mask=tl.sum(hits, axis=1) > 0)
        seen += tl.sum(hits, axis=0)


@triton.jit
def _expert_hits(
    TOPK_IDS, N_ACTIVE, e, token, n_pairs, top_k, HAS_N_ACTIVE: tl.constexpr, K_PAD: tl.constexpr
):
    """``[rows, K_PAD]``: whether pair ``(token, r)`` is active and selects expert ``e`` (one load of the ids)."""
    ranks = tl.arange(0, K_PAD)[None, :]
    pair = token[:, None] * top_k + ranks
    in_range = (ranks < top_k) & (pair < n_pairs)
    ok = in_range & (tl.load(TOPK_IDS + pair, mask=in_range, other=-1) == e)
    if HAS_N_ACTIVE:
        n = tl.load(N_ACTIVE + token, mask=token * top_k < n_pairs, other=0)
        ok = ok & (ranks < n[:, None])
    return ok


@triton.jit
def _block(
    SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS, TOPK_IDS, N_ACTIVE, n_pairs, top_k, n_experts,
    LAYOUT: tl.constexpr, HAS_N_ACTIVE: tl.constexpr, BLOCK_M: tl.constexpr, K_PAD: tl.constexpr,
):  # fmt: skip
    """The program's block (``program_id(0)``): whether it has work, its expert (int64), which of its ``BLOCK_M``
    rows are real, each row's token and the row of ``h`` it owns (both int64). Layouts (see the module docstring):
    `PAIRS` block ``b`` is pair ``b``, one row; `ALIGNED` as ``_align_kernel`` wrote it; `EXPERTS` program ``e`` is
    expert ``e``, row ``t`` is token ``t`` when one of its active pairs selects ``e`` (``h`` row: the first such
    pair)."""
    blk = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    if LAYOUT == 0:  # PAIRS
        e, live = _pair_active(TOPK_IDS, N_ACTIVE, blk, top_k, top_k, n_experts, HAS_N_ACTIVE)
        row_ok = offs_m < 1
        token = tl.zeros([BLOCK_M], dtype=tl.int64)
        slot = offs_m.to(tl.int64) + blk
    elif LAYOUT == 1:  # ALIGNED
        rows = tl.load(BLOCK_ROWS + blk)
        live = rows > 0
        e = tl.load(BLOCK_EXPERT + blk)
        row_ok = offs_m < rows
        pair = tl.load(SLOT_PAIR + blk * BLOCK_M + offs_m, mask=row_ok, other=0).to(tl.int64)
        token = pair // top_k
        slot = (blk * BLOCK_M + offs_m).to(tl.int64)
    else:  # EXPERTS
        e = blk
        token = offs_m.to(tl.int64)
        hits = _expert_hits(TOPK_IDS, N_ACTIVE, e, token, n_pairs, top_k, HAS_N_ACTIVE, K_PAD)
        ranks = tl.arange(0, K_PAD)[None, :]
        first = tl.min(tl.where(hits, ranks, K_PAD), axis=1)  # the token's first active pair selecting e
        row_ok = first < K_PAD
        live = tl.max(row_ok.to(tl.int32), axis=0) > 0
        slot = token * top_k + tl.where(row_ok, first, 0)
    return live, e.to(tl.int64), row_ok, token, slot


@triton.jit
def _gate_up_kernel(
    X, W, H, SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS, TOPK_IDS, N_ACTIVE,
    hidden, inter, top_k, n_experts,
    s_xt, s_we, s_wn, s_wk, s_ht, n_pairs,
    LAYOUT: tl.constexpr, HAS_N_ACTIVE: tl.constexpr, K_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    live, e, row_ok, token, slot = _block(
        SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS, TOPK_IDS, N_ACTIVE, n_pairs, top_k, n_experts,
        LAYOUT, HAS_N_ACTIVE, BLOCK_M, K_PAD,
    )  # fmt: skip
    if not live:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)

    p_x = X + token[:, None] * s_xt + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    p_g = W + e * s_we + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk  # [BLOCK_K, BLOCK_N] of gate^T
    p_u = p_g + inter * s_wn  # up rows follow the gate rows
    b_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = k0 + offs_k < hidden
        b_x = tl.load(p_x, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w_ok = k_ok[:, None] & n_ok[None, :]
        b_wg = tl.load(p_g, mask=w_ok, other=0.0).to(DOT_DTYPE)
        b_wu = tl.load(p_u, mask=w_ok, other=0.0).to(DOT_DTYPE)
        b_g = tl.dot(b_x, b_wg, b_g, input_precision=DOT_PRECISION)
        b_u = tl.dot(b_x, b_wu, b_u, input_precision=DOT_PRECISION)
        p_x += BLOCK_K
        p_g += BLOCK_K * s_wk
        p_u += BLOCK_K * s_wk
    b_h = b_g * tl.sigmoid(b_g) * b_u  # [BLOCK_M, BLOCK_N]
    p_h = H + slot[:, None] * s_ht + offs_n[None, :]
    tl.store(p_h, b_h.to(H.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _down_kernel(
    H, W, PAIR_OUT, SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS, TOPK_IDS, N_ACTIVE,
    hidden, inter, top_k, n_experts,
    s_ht, s_we, s_wn, s_wk, s_pt, n_pairs,
    LAYOUT: tl.constexpr, HAS_N_ACTIVE: tl.constexpr, K_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    live, e, row_ok, token, slot = _block(
        SLOT_PAIR, BLOCK_EXPERT, BLOCK_ROWS, TOPK_IDS, N_ACTIVE, n_pairs, top_k, n_experts,
        LAYOUT, HAS_N_ACTIVE, BLOCK_M, K_PAD,
    )  # fmt: skip
    if not live:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    offs_k = tl.arange(0, BLOCK_K)

    p_h = H + slot[:, None] * s_ht + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    p_w = W + e * s_we + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk  # [BLOCK_K, BLOCK_N] of down^T
    b_y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = k0 + offs_k < inter
        b_h = tl.load(p_h, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_w = tl.load(p_w, mask=k_ok[:, None] & n_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_y = tl.dot(b_h, b_w, b_y, input_precision=DOT_PRECISION)
        p_h += BLOCK_K
        p_w += BLOCK_K * s_wk
    # y unweighted in float32, at the row of the block's pair: the ALIGNED slot's pair, else the h row (PAIRS: the
    # pair; EXPERTS: the token's first active pair that selects e). `_sum_kernel` applies the routing weights.
    row = tl.load(SLOT_PAIR + slot, mask=row_ok, other=0).to(tl.int64) if LAYOUT == 1 else slot
    tl.store(PAIR_OUT + row[:, None] * s_pt + offs_n[None, :], b_y, mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_kernel(
    PAIR_OUT, TOPK_IDS, TOPK_W, N_ACTIVE, RESIDUAL, OUT,
    hidden, top_k, n_experts, s_pt, s_rt, s_ot,
    HAS_N_ACTIVE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, K_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """``out[t] = sum_r w[t, r] * y[t, r]`` over the token's active pairs, in float32, in a fixed order (one
    reduction over the ranks: deterministic, no atomics). ``y`` of pair ``(t, r)`` is the row of the token's first
    active pair with the same expert (the one `_down_kernel` wrote when an id repeats). All k rows are loaded at once:
    a loop over the ranks issued its loads one after another (4.6 us per call for one token on the H200).

    With ``HAS_RESIDUAL``: ``out[t] = residual[t] + sum`` with the sum first rounded to the activation dtype, bitwise
    the decoder layer's ``residual + experts(x)`` (one launch fewer)."""
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < hidden
    ranks = tl.arange(0, K_PAD)
    in_row = ranks < top_k
    ids = tl.load(TOPK_IDS + t * top_k + ranks, mask=in_row, other=-1)
    ok = in_row & (ids >= 0) & (ids < n_experts)
    if HAS_N_ACTIVE:
        ok = ok & (ranks < tl.load(N_ACTIVE + t))
    # first[r]: the lowest active rank with the same expert as rank r
    same = (ids[:, None] == ids[None, :]) & ok[None, :]
    first = tl.min(tl.where(same, ranks[None, :], K_PAD), axis=1)
    b_w = tl.load(TOPK_W + t * top_k + ranks, mask=ok, other=0.0).to(tl.float32)
    p_y = PAIR_OUT + (t * top_k + first)[:, None] * s_pt + offs_h[None, :]
    b_y = tl.load(p_y, mask=ok[:, None] & h_ok[None, :], other=0.0)
    b_out = tl.sum(b_y * b_w[:, None], axis=0)
    if HAS_RESIDUAL:
        b_r = tl.load(RESIDUAL + t * s_rt + offs_h, mask=h_ok, other=0.0).to(tl.float32)
        b_out = b_r + b_out.to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + t * s_ot + offs_h, b_out.to(OUT.dtype.element_ty), mask=h_ok)


def block_m_for(pairs: int, experts: int) -> int:
    """Rows per block, from shapes only: 16 while experts average a few pairs (decode, verify), more for
    prefill-sized inputs."""
    per_expert = pairs / experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def max_blocks(pairs: int, experts: int, block_m: int) -> int:
    """The most blocks any routing of ``pairs`` pairs over ``experts`` experts can fill:
    ``sum_e ceil(c_e / block_m) <= (pairs + nonzero * (block_m - 1)) // block_m``, and at most ``pairs``."""
    nonzero = min(experts, pairs)
    return min(pairs, (pairs + nonzero * (block_m - 1)) // block_m)


def _weight_strides(weight: torch.Tensor, transposed: bool) -> tuple[int, int, int]:
    """Strides ``(expert, n, k)`` of ``W[e, n, k]`` (output dim n, reduced dim k) for a ``[E, N, K]`` weight, or
    a ``[E, K, N]`` one when ``transposed``."""
    s_e, s_1, s_2 = weight.stride()
    return (s_e, s_2, s_1) if transposed else (s_e, s_1, s_2)


def _empty(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Every buffer of the launch (tests poison them through this)."""
    return torch.empty(shape, device=device, dtype=dtype)


def align(
    top_k_index: torch.Tensor, n_active: torch.Tensor | None, n_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block layout of the active pairs (``_align_kernel``): ``slot_pair`` ``[blocks * block_m]`` int32 (pair
    ``t * k + r`` in each used slot; unused slots are not written), ``block_expert`` ``[blocks]`` int32 (-1 past the
    used blocks) and ``block_rows`` ``[blocks]`` int32 (used slots of each block, 0 past the used blocks), with
    ``blocks = max_blocks(T * k, n_experts, block_m)``. ``top_k_index`` ``[T, k]`` contiguous."""
    pairs = top_k_index.numel()
    n_blocks = max_blocks(pairs, n_experts, block_m)
    device = top_k_index.device
    slot_pair = _empty((n_blocks * block_m,), device, torch.int32)
    block_expert = _empty((n_blocks,), device, torch.int32)
    block_rows = _empty((n_blocks,), device, torch.int32)
    e_block = max(16, next_power_of_2(n_experts))
    chunk = max(16, min(next_power_of_2(max(pairs, n_blocks)), 8192 // e_block))
    _align_kernel[(1,)](
        top_k_index, n_active if n_active is not None else top_k_index, slot_pair, block_expert, block_rows,
        pairs, n_blocks, top_k_index.shape[1], n_experts,
        HAS_N_ACTIVE=n_active is not None, BLOCK_M=block_m, CHUNK=chunk, E_BLOCK=e_block,
        num_warps=4 if chunk * e_block <= 2048 else 8,
        **pdl_launch(top_k_index.device),
    )  # fmt: skip
    return slot_pair, block_expert, block_rows


#: layout codes of the kernels' ``LAYOUT`` (`_block`)
PAIRS, ALIGNED, EXPERTS = 0, 1, 2
#: steps of 2 .. this many tokens use the `EXPERTS` layout (no align launch); more tokens are grouped by `align`.
#: Measured on an H200 (Qwen3-30B-A3B, 8-token verify step, 48 layers): ``_align_kernel`` alone took 10 us per layer,
#: 14.6 with expert skipping (``benchmarks/diag_moe_skip.py``)
EXPERT_GRID_MAX_TOKENS = 16


@dataclass(frozen=True)
class _Layout:
    """Which pairs each program of the gate/up and down grids computes (see `_block`): the code, the programs
    along the grid's first axis, rows per program, rows of ``h``, and the `align` buffers (`ALIGNED` only)."""

    code: int
    programs: int
    block_m: int
    h_rows: int
    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def _layout(top_k_index: torch.Tensor, n_active: torch.Tensor | None, n_experts: int) -> _Layout:
    """From shapes only: `PAIRS` for one token (block ``b`` is pair ``b``), `EXPERTS` up to
    `EXPERT_GRID_MAX_TOKENS` tokens (program ``e`` is expert ``e``, its rows are tokens), `ALIGNED` above."""
    tokens, top_k = top_k_index.shape
    if tokens == 1:
        return _Layout(PAIRS, top_k, 16, top_k)
    if tokens <= EXPERT_GRID_MAX_TOKENS:
        return _Layout(EXPERTS, n_experts, max(16, next_power_of_2(tokens)), tokens * top_k)
    block_m = block_m_for(tokens * top_k, n_experts)
    buffers = align(top_k_index, n_active, n_experts, block_m)
    blocks = buffers[2].shape[0]
    return _Layout(ALIGNED, blocks, block_m, blocks * block_m, buffers)


@on_input_device
def launch(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    n_active: torch.Tensor | None,
    transposed: bool,
    out: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the kernels (inputs as `fused_experts` checks them; ``hidden`` and ``residual`` with unit last stride,
    ``top_k_index`` / ``top_k_weights`` contiguous): three launches up to `EXPERT_GRID_MAX_TOKENS` tokens (no
    align), four above. Returns ``[T, H]`` in ``hidden.dtype`` (into ``out`` if given), plus ``residual`` if given."""
    tokens, dim = hidden.shape
    if out is None:
        out = _empty((tokens, dim), hidden.device, hidden.dtype)
    if tokens == 0:
        return out
    top_k = top_k_index.shape[1]
    n_experts = w_gate_up.shape[0]
    layout = _layout(top_k_index, n_active, n_experts)
    n_active_or_ids = n_active if n_active is not None else top_k_index
    buffers = layout.buffers or (top_k_index,) * 3  # unread outside ALIGNED
    tiles = TILES_ONE_TOKEN if layout.code == PAIRS else TILES
    dot_dtype, precision = _dot_settings(hidden.dtype)
    common = dict(
        LAYOUT=layout.code, HAS_N_ACTIVE=n_active is not None, K_PAD=max(2, next_power_of_2(top_k)),
        BLOCK_M=layout.block_m, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
    )  # fmt: skip

    inter = w_gate_up.shape[2 if transposed else 1] // 2
    h = _empty((layout.h_rows, inter), hidden.device, hidden.dtype)
    bn = min(tiles["gate_up_n"], max(16, next_power_of_2(inter)))
    bk = min(tiles["gate_up_k"], max(16, next_power_of_2(dim)))
    _gate_up_kernel[(layout.programs, triton.cdiv(inter, bn))](
        hidden, w_gate_up, h, *buffers, top_k_index, n_active_or_ids,
        dim, inter, top_k, n_experts,
        hidden.stride(0), *_weight_strides(w_gate_up, transposed), h.stride(0), tokens * top_k,
        BLOCK_N=bn, BLOCK_K=bk, **common,
        **pdl_launch(hidden.device),
    )  # fmt: skip

    pair_out = _empty((tokens * top_k, dim), hidden.device, torch.float32)  # [T * k, H]
    bn = min(tiles["down_n"], max(16, next_power_of_2(dim)))
    bk = min(tiles["down_k"], max(16, next_power_of_2(inter)))
    _down_kernel[(layout.programs, triton.cdiv(dim, bn))](
        h, w_down, pair_out, *buffers, top_k_index, n_active_or_ids,
        dim, inter, top_k, n_experts,
        h.stride(0), *_weight_strides(w_down, transposed), pair_out.stride(0), tokens * top_k,
        BLOCK_N=bn, BLOCK_K=bk, **common,
        **pdl_launch(h.device),
    )  # fmt: skip

    block_h = min(256, next_power_of_2(dim))
    _sum_kernel[(tokens, triton.cdiv(dim, block_h))](
        pair_out, top_k_index, top_k_weights, n_active_or_ids, residual if residual is not None else out, out,
        dim, top_k, n_experts, pair_out.stride(0), residual.stride(0) if residual is not None else 0, out.stride(0),
        HAS_N_ACTIVE=n_active is not None, HAS_RESIDUAL=residual is not None, K_PAD=common["K_PAD"],
        BLOCK_H=block_h,
        num_warps=4,
        **pdl_launch(pair_out.device),
    )  # fmt: skip
    return out


def _dot_settings(dtype: torch.dtype) -> tuple:
    """``(DOT_DTYPE, DOT_PRECISION)`` of the matmul kernels for activations of ``dtype``."""
    dot_dtype = _TL_DTYPE[torch.float32 if dot_in_float32(dtype) else dtype]
    return dot_dtype, "ieee" if dot_dtype == tl.float32 else "tf32"  # tf32 only matters for float32 operands
