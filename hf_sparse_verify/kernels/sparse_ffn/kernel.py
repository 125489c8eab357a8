"""Triton kernels of the gated MLP for the few rows of decode and verify steps.

- ``_gated_act_kernel``, grid ``(T / BLOCK_M, I / BLOCK_N)``: ``h = silu(x @ w_gate^T) * (x @ w_up^T)``. One program
  owns a tile of ``BLOCK_N`` channels and reads its gate and up rows in the same pass over ``H``; for ``T <=
  BLOCK_M`` (every decode and verify step: up to 64 rows) each weight is read exactly once, GEMV-style. Products
  accumulate in float32; gate, up, ``silu(gate)`` and the product are rounded to ``x.dtype`` where eager rounds them.
- the sparse FFN of a verify step (the sparse-verification paper §3.4), for ``B`` batch rows of ``q`` tokens:
  - ``_gate_keep_kernel``, grid ``(B / BLOCK_B, I / BLOCK_N)``: ``act = silu(x @ w_gate^T)`` for every channel, the
    row mask ``keep[b, i]`` (``|act|`` of one of row ``b``'s tokens reaches ``tau``), and ``h = act`` where the row
    keeps the channel, 0 where it does not.
  - ``_kept_channels_kernel``, one program: the channels some row keeps, in ascending order, and their count
    (``channels`` ``[I + 1]`` int32, count last), by a running prefix sum over chunks of the mask.
  - ``_compact_up_kernel``, grid ``(B / BLOCK_B, I / BLOCK_N, K_SPLIT)``: tile ``j`` takes positions ``j * BLOCK_N
    ..`` of the list (programs past the count return at once), gathers those rows of ``w_up`` and multiplies ``h``
    by ``up``: in place, or into a compacted ``[B * q, I]`` whose column ``j`` is listed channel ``j``. The hidden
    dimension is split over ``K_SPLIT`` programs per tile (a few hundred listed channels alone leave most of the
    GPU idle); each stores its partial sum, and the last to arrive (an atomic counter per tile) adds them in split
    order, so the result does not depend on the order of arrival.
  - ``_compact_down_kernel``, grid ``(H / BLOCK_N, SPLIT, rows / BLOCK_M)``: ``y = h @ w_down_t`` over split ``p`` of
    the list (the split length follows the count, read on the device); with ``SPLIT > 1`` the splits land in a
    float32 scratch and ``_sum_splits_kernel`` adds them in order (deterministic, no atomics) and rounds.

Up and down loop over the list, not over all ``I`` channels: a skipped channel costs neither a read nor a loop step,
and no load waits on a mask load. (The first version predicated every weight load on the mask instead: with every
channel skipped its down kernel still took 23.8 us on an H200, against a 31.6 us down projection at half the
channels kept.) The list is built on the device, so every grid depends on shapes only (no host sync; CUDA-graph
capturable). ``sparse_ffn_launch`` builds the list once for up and down.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: tile settings of the dense ``gated_act`` (chosen for decode/verify row counts) and of the sparse kernels, from
#: three H200 sweeps (`benchmarks/sweep_sparse_ffn.py`, 8B MLP, one row of 16 verify tokens, 50% / 75% of the channels
#: skipped, us per launch; `results/sweep_sparse_ffn.json (record compact)`). Gate: 30.7 with 32 channels and 4 warps
#: (8 warps 54.9, 4 stages 43.2, 256-wide steps 33.9). List: 4.4-4.6 in one 16384-channel chunk with 8 warps (6.6 in
#: 4096-channel chunks with 4; 42 in one chunk with 4). Up: 21.5 / 13.8 with two hidden splits (22.9 / 15.8 unsplit,
#: 25.4 / 15.3 with four; 16- or 64-channel tiles, 256- or 512-wide steps and more stages were no better). Down: 23.4
#: / 12.6 (128-channel steps; the other tiles tried within 1 us or slower).
TILES = {
    "act_n": 32, "act_k": 128, "num_warps": 4,
    "gate_n": 32, "gate_k": 128, "gate_warps": 4, "gate_stages": 3,
    "up_n": 32, "up_k": 128, "up_warps": 4, "up_stages": 3, "up_split": 2,
    "down_n": 64, "down_s": 128, "down_warps": 4, "down_stages": 3,
    "list_block": 16384, "list_warps": 8,
}  # fmt: skip
#: the sparse kernels take whole batch rows per tile, up to this many token rows (batch rows x padded tokens): 8
#: rows of 16 verify tokens share one read of the weights
SPARSE_ROWS = 128
#: the down kernel splits the channels until about this many programs run
DOWN_PROGRAMS = 512

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _gated_act_kernel(
    X, WG, WU, OUT,
    n_rows, n_inter, n_hidden, s_x, s_wg, s_wu, s_o,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < n_rows
    n_ok = offs_n < n_inter
    b_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    b_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, n_hidden, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < n_hidden
        p_x = X + offs_m[:, None].to(tl.int64) * s_x + k[None, :]
        b_x = tl.load(p_x, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        w_ok = n_ok[:, None] & k_ok[None, :]
        b_wg = tl.load(WG + offs_n[:, None] * s_wg + k[None, :], mask=w_ok, other=0.0).to(DOT_DTYPE)
        b_wu = tl.load(WU + offs_n[:, None] * s_wu + k[None, :], mask=w_ok, other=0.0).to(DOT_DTYPE)
        b_gate = tl.dot(b_x, tl.trans(b_wg), b_gate, input_precision=DOT_PRECISION)
        b_up = tl.dot(b_x, tl.trans(b_wu), b_up, input_precision=DOT_PRECISION)
    dtype = OUT.dtype.element_ty
    b_gate = b_gate.to(dtype).to(tl.float32)
    b_act = (b_gate * tl.sigmoid(b_gate)).to(dtype).to(tl.float32)
    b_h = b_act * b_up.to(dtype).to(tl.float32)
    p_o = OUT + offs_m[:, None].to(tl.int64) * s_o + offs_n[None, :]
    tl.store(p_o, b_h.to(dtype), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _rows_by_weight(
    p_x, m_ok, p_w, w_ok, k_lo, k_hi,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """``[BLOCK_M, BLOCK_N]`` float32: the tile's token rows (``p_x`` ``[BLOCK_M, 1]`` row pointers) times the weight
    rows ``p_w`` (``[BLOCK_N, 1]`` row pointers) over ``H`` range ``[k_lo, k_hi)``; rows with ``w_ok`` False are never
    loaded (they count as 0)."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < k_hi
        b_x = tl.load(p_x + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_w = tl.load(p_w + k[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        acc = tl.dot(b_x, tl.trans(b_w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _gate_keep_kernel(
    X, WG, TAU, H, KEEP,
    n_batch, q_len, n_inter, n_hidden, s_xb, s_xt, s_wg, s_hb, s_ht, s_kb,
    BLOCK_B: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    BLOCK_M: tl.constexpr = BLOCK_B * BLOCK_Q
    offs_m = tl.arange(0, BLOCK_M)
    row_b = tl.program_id(0) * BLOCK_B + offs_m // BLOCK_Q  # batch row of each tile row
    row_t = offs_m % BLOCK_Q  # its token
    m_ok = (row_b < n_batch) & (row_t < q_len)
    p_x = X + row_b.to(tl.int64)[:, None] * s_xb + row_t[:, None] * s_xt
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = offs_n < n_inter
    b_gate = _rows_by_weight(p_x, m_ok, WG + offs_n[:, None] * s_wg, n_ok, 0, n_hidden,
                             BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    dtype = H.dtype.element_ty
    b_gate = b_gate.to(dtype).to(tl.float32)
    b_act = (b_gate * tl.sigmoid(b_gate)).to(dtype).to(tl.float32)

    # the row mask: max over the batch row's tokens of |act| against tau (float32); padding rows never keep
    b_mag = tl.where(m_ok[:, None], tl.abs(b_act), -1.0)
    b_keep = tl.max(tl.reshape(b_mag, [BLOCK_B, BLOCK_Q, BLOCK_N]), axis=1) >= tl.load(
        TAU
    )  # [BLOCK_B, BLOCK_N]
    offs_bb = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    p_keep = KEEP + offs_bb.to(tl.int64)[:, None] * s_kb + offs_n[None, :]
    tl.store(p_keep, b_keep.to(tl.int8), mask=(offs_bb < n_batch)[:, None] & n_ok[None, :])
    b_rows = tl.reshape(tl.broadcast_to(b_keep[:, None, :], [BLOCK_B, BLOCK_Q, BLOCK_N]), [BLOCK_M, BLOCK_N])
    p_h = H + row_b.to(tl.int64)[:, None] * s_hb + row_t[:, None] * s_ht + offs_n[None, :]
    tl.store(p_h, tl.where(b_rows, b_act, 0.0).to(dtype), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _kept_channels_kernel(
    KEEP, CHANNELS, n_batch, n_inter, s_kb, BLOCK: tl.constexpr, PDL: tl.constexpr
):  # fmt: skip
    pdl_wait(PDL)
    offs = tl.arange(0, BLOCK)
    count = 0
    for c0 in range(0, n_inter, BLOCK):
        c = c0 + offs
        c_ok = c < n_inter
        used = tl.zeros([BLOCK], dtype=tl.int32)
        for b in range(n_batch):
            used = tl.maximum(used, tl.load(KEEP + b * s_kb + c, mask=c_ok, other=0).to(tl.int32))
        slot = count + tl.cumsum(used, axis=0) - 1  # position of each used channel in the list
        tl.store(CHANNELS + slot, c.to(tl.int32), mask=used > 0)
        count += tl.sum(used, axis=0)
    tl.store(CHANNELS + n_inter, count)


@triton.jit
def _compact_up_kernel(
    X, WU, H, CHANNELS, HC, PART, ARRIVED,
    n_batch, q_len, n_inter, n_hidden, s_xb, s_xt, s_wu, s_hb, s_ht, s_hcm,
    BLOCK_B: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    K_SPLIT: tl.constexpr, COMPACT_OUT: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    count = tl.load(CHANNELS + n_inter)
    pos0 = tl.program_id(1) * BLOCK_N
    if pos0 < count:
        BLOCK_M: tl.constexpr = BLOCK_B * BLOCK_Q
        offs_m = tl.arange(0, BLOCK_M)
        row_b = tl.program_id(0) * BLOCK_B + offs_m // BLOCK_Q
        row_t = offs_m % BLOCK_Q
        m_ok = (row_b < n_batch) & (row_t < q_len)
        p_x = X + row_b.to(tl.int64)[:, None] * s_xb + row_t[:, None] * s_xt
        offs_p = tl.arange(0, BLOCK_N)
        pos = pos0 + offs_p
        p_ok = pos < count
        chan = tl.load(CHANNELS + pos, mask=p_ok, other=0).to(tl.int64)  # [BLOCK_N] kept channels
        # split ks of K_SPLIT takes a range of H (whole BLOCK_K steps)
        ks = tl.program_id(2)
        per_split = tl.cdiv(tl.cdiv(n_hidden, K_SPLIT), BLOCK_K) * BLOCK_K
        k_lo = ks * per_split
        k_hi = tl.minimum(k_lo + per_split, n_hidden)
        b_up = _rows_by_weight(p_x, m_ok, WU + chan[:, None] * s_wu, p_ok, k_lo, k_hi,
                               BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
        if K_SPLIT == 1:
            _finish_up(
                b_up, H, HC, row_b, row_t, m_ok, chan, pos, p_ok, q_len, s_hb, s_ht, s_hcm, COMPACT_OUT
            )
        else:
            # each split stores its partial sum; the last split of the tile to arrive adds all of them in split
            # order (the same sum whoever arrives last) and finishes; the counters start at zero on every call
            tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
            p_part = PART + ((tile * K_SPLIT + ks) * BLOCK_M + offs_m[:, None]) * BLOCK_N + offs_p[None, :]
            tl.store(p_part, b_up)
            tl.debug_barrier()  # every thread's partial is written before the release below
            if tl.atomic_add(ARRIVED + tile, 1, sem="acq_rel") == K_SPLIT - 1:
                b_sum = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for j in tl.static_range(K_SPLIT):
                    p_j = (
                        PART + ((tile * K_SPLIT + j) * BLOCK_M + offs_m[:, None]) * BLOCK_N + offs_p[None, :]
                    )
                    b_sum += tl.load(p_j, cache_modifier=".cg")
                _finish_up(
                    b_sum, H, HC, row_b, row_t, m_ok, chan, pos, p_ok, q_len, s_hb, s_ht, s_hcm, COMPACT_OUT
                )


@triton.jit
def _finish_up(
    b_up, H, HC, row_b, row_t, m_ok, chan, pos, p_ok, q_len, s_hb, s_ht, s_hcm, COMPACT_OUT: tl.constexpr
):  # fmt: skip
    """``h = act * up`` on the listed channels ``chan`` (``h`` holds ``act`` where the row keeps the channel and 0
    where it does not, from `_gate_keep_kernel`), rounded as eager rounds it; into ``h`` or the compacted ``HC``."""
    dtype = H.dtype.element_ty
    p_h = H + row_b.to(tl.int64)[:, None] * s_hb + row_t[:, None] * s_ht + chan[None, :]
    hm_ok = m_ok[:, None] & p_ok[None, :]
    b_act = tl.load(p_h, mask=hm_ok, other=0.0).to(tl.float32)
    b_h = (b_act * b_up.to(dtype).to(tl.float32)).to(dtype)
    if COMPACT_OUT:  # [B * q, count]: column = position in the channel list
        rows = (row_b * q_len + row_t).to(tl.int64)
        tl.store(HC + rows[:, None] * s_hcm + pos[None, :], b_h, mask=hm_ok)
    else:
        tl.store(p_h, b_h, mask=hm_ok)


@triton.jit
def _compact_down_kernel(
    HS, WD, CHANNELS, OUT,
    n_rows, n_inter, n_hidden, s_hm, s_wd_c, s_wd_h, s_op, s_or,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT: tl.constexpr,
    H_COMPACT: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_hidden
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < n_rows
    split = tl.program_id(1)
    count = tl.load(CHANNELS + n_inter)
    per_split = tl.cdiv(tl.cdiv(count, SPLIT), BLOCK_S) * BLOCK_S  # positions per split, whole steps
    lo = split * per_split
    hi = tl.minimum(lo + per_split, count)
    offs_s = tl.arange(0, BLOCK_S)
    b_y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        pos = s0 + offs_s
        p_ok = pos < hi
        chan = tl.load(CHANNELS + pos, mask=p_ok, other=0).to(tl.int64)
        h_col = pos if H_COMPACT else chan
        p_h = HS + offs_m.to(tl.int64)[:, None] * s_hm + h_col[None, :]
        b_h = tl.load(p_h, mask=m_ok[:, None] & p_ok[None, :], other=0.0).to(DOT_DTYPE)
        p_w = WD + chan[:, None] * s_wd_c + offs_n[None, :].to(tl.int64) * s_wd_h
        b_w = tl.load(p_w, mask=p_ok[:, None] & n_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_y = tl.dot(b_h, b_w, b_y, input_precision=DOT_PRECISION)
    p_o = OUT + split.to(tl.int64) * s_op + offs_m.to(tl.int64)[:, None] * s_or + offs_n[None, :]
    tl.store(p_o, b_y.to(OUT.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _sum_splits_kernel(
    PART, OUT, n_elements, s_p, SPLIT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    pdl_wait(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_elements
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(SPLIT):
        acc += tl.load(PART + p * s_p + offs, mask=ok, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=ok)


def _empty(shape, device, dtype) -> torch.Tensor:
    """Output / scratch allocation (tests poison it with NaN)."""
    return torch.empty(shape, device=device, dtype=dtype)


def _dot(dtype: torch.dtype):
    dot_dtype = _TL_DTYPE[torch.float32 if dot_in_float32(dtype) else dtype]
    return dot_dtype, "ieee" if dot_dtype == tl.float32 else "tf32"  # tf32 only matters for float32 operands


def _block(n: int, cap: int) -> int:
    return min(cap, max(16, next_power_of_2(n)))


@on_input_device
def gated_act_launch(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, H]`` (unit last stride), ``w_gate`` / ``w_up`` ``[I, H]`` (unit last stride) -> ``[T, I]``."""
    rows, hidden = x.shape
    inter = w_gate.shape[0]
    out = _empty((rows, inter), x.device, x.dtype)
    if rows == 0:
        return out
    bm = _block(rows, 64)
    bn = _block(inter, TILES["act_n"])
    bk = _block(hidden, TILES["act_k"])
    dot_dtype, precision = _dot(x.dtype)
    _gated_act_kernel[(triton.cdiv(rows, bm), triton.cdiv(inter, bn))](
        x, w_gate, w_up, out,
        rows, inter, hidden, x.stride(0), w_gate.stride(0), w_up.stride(0), out.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=TILES["num_warps"],
        **pdl_launch(x.device),
    )  # fmt: skip
    return out


def sparse_rows(batch: int, q_len: int) -> tuple[int, int]:
    """``(BLOCK_B, BLOCK_Q)``: whole batch rows per tile (``BLOCK_B * BLOCK_Q`` token rows, at least 16 for
    ``tl.dot``, at most `SPARSE_ROWS` unless one row's tokens need more)."""
    block_q = next_power_of_2(q_len)
    block_b = min(next_power_of_2(batch), max(1, SPARSE_ROWS // block_q))
    return max(block_b, 16 // block_q if block_q < 16 else 1), block_q


def down_splits(tiles: int, inter: int) -> int:
    """How many channel ranges the down kernel cuts ``I`` into, for ``tiles`` (row chunk, column tile) programs."""
    return max(1, min(triton.cdiv(DOWN_PROGRAMS, tiles), triton.cdiv(inter, 4 * TILES["down_s"])))


def _gate_keep(x, w_gate, tau):
    """``h`` ``[B, q, I]`` (``silu(gate)`` where the row keeps the channel, else 0) and ``keep`` ``[B, I]`` int8."""
    batch, q_len, hidden = x.shape
    inter = w_gate.shape[0]
    h = _empty((batch, q_len, inter), x.device, x.dtype)
    keep = _empty((batch, inter), x.device, torch.int8)
    block_b, block_q = sparse_rows(batch, q_len)
    bn = _block(inter, TILES["gate_n"])
    bk = _block(hidden, TILES["gate_k"])
    dot_dtype, precision = _dot(x.dtype)
    _gate_keep_kernel[(triton.cdiv(batch, block_b), triton.cdiv(inter, bn))](
        x, w_gate, tau, h, keep,
        batch, q_len, inter, hidden, x.stride(0), x.stride(1), w_gate.stride(0), h.stride(0), h.stride(1),
        keep.stride(0),
        BLOCK_B=block_b, BLOCK_Q=block_q, BLOCK_N=bn, BLOCK_K=bk, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=TILES["gate_warps"], num_stages=TILES["gate_stages"],
        **pdl_launch(x.device),
    )  # fmt: skip
    return h, keep


@on_input_device
def kept_channels_launch(keep: torch.Tensor) -> torch.Tensor:
    """``keep`` ``[B, I]`` int8 or bool (unit last stride) -> ``[I + 1]`` int32: the channels some row keeps, in
    ascending order, then garbage up to ``I``; the last element is their count. One program; no host sync."""
    if keep.dtype == torch.bool:
        keep = keep.view(torch.int8)
    batch, inter = keep.shape
    channels = _empty((inter + 1,), keep.device, torch.int32)
    _kept_channels_kernel[(1,)](
        keep, channels, batch, inter, keep.stride(0), BLOCK=_block(inter, TILES["list_block"]),
        num_warps=TILES["list_warps"],
        **pdl_launch(keep.device),
    )  # fmt: skip
    return channels


def _compact_up(x, w_up, h, channels, compact_out: bool):
    """``silu(gate) * up`` over the listed channels (``h`` from `_gate_keep`: its zeros carry the row masks): into
    ``h`` in place (``compact_out`` False) or into a new ``[B * q, I]`` whose column ``j`` is listed channel ``j``
    (returned). With ``TILES["up_split"] > 1`` the hidden dimension is split over that many programs per tile."""
    batch, q_len, hidden = x.shape
    inter = w_up.shape[0]
    hc = _empty((batch * q_len, inter), x.device, x.dtype) if compact_out else h
    block_b, block_q = sparse_rows(batch, q_len)
    bn = _block(inter, TILES["up_n"])
    bk = _block(hidden, TILES["up_k"])
    k_split = max(1, min(TILES["up_split"], triton.cdiv(hidden, bk)))
    grid = (triton.cdiv(batch, block_b), triton.cdiv(inter, bn), k_split)
    tiles = grid[0] * grid[1]
    if k_split > 1:  # partial sums and per-tile arrival counters
        part = _empty((tiles, k_split, block_b * block_q, bn), x.device, torch.float32)
        arrived = torch.zeros(tiles, device=x.device, dtype=torch.int32)
    else:
        part = arrived = channels  # never touched
    dot_dtype, precision = _dot(x.dtype)
    _compact_up_kernel[grid](
        x, w_up, h, channels, hc, part, arrived,
        batch, q_len, inter, hidden, x.stride(0), x.stride(1), w_up.stride(0), h.stride(0), h.stride(1),
        hc.stride(0) if compact_out else 0,
        BLOCK_B=block_b, BLOCK_Q=block_q, BLOCK_N=bn, BLOCK_K=bk, K_SPLIT=k_split, COMPACT_OUT=compact_out,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=precision, num_warps=TILES["up_warps"], num_stages=TILES["up_stages"],
        **pdl_launch(x.device),
    )  # fmt: skip
    return hc


def _compact_down(hs, w_down_t, channels, compact_h: bool):
    """``hs`` ``[T, I]`` (``compact_h``: column ``j`` is listed channel ``j``) times the listed rows of
    ``w_down_t`` -> ``[T, H]`` in ``hs.dtype``."""
    rows, inter = hs.shape
    hidden = w_down_t.shape[1]
    out = _empty((rows, hidden), hs.device, hs.dtype)
    bm = _block(rows, SPARSE_ROWS)
    bn = _block(hidden, TILES["down_n"])
    tiles = triton.cdiv(rows, bm) * triton.cdiv(hidden, bn)
    split = down_splits(tiles, inter)
    part = out if split == 1 else _empty((split, rows, hidden), hs.device, torch.float32)
    dot_dtype, precision = _dot(hs.dtype)
    _compact_down_kernel[(triton.cdiv(hidden, bn), split, triton.cdiv(rows, bm))](
        hs, w_down_t, channels, part,
        rows, inter, hidden, hs.stride(0), w_down_t.stride(0), w_down_t.stride(1),
        part.stride(0) if split > 1 else 0, hidden,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_S=_block(inter, TILES["down_s"]), SPLIT=split, H_COMPACT=compact_h,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=precision, num_warps=TILES["down_warps"], num_stages=TILES["down_stages"],
        **pdl_launch(hs.device),
    )  # fmt: skip
    if split > 1:
        n = out.numel()
        _sum_splits_kernel[(triton.cdiv(n, 1024),)](
            part, out, n, part.stride(0), SPLIT=split, BLOCK=1024, num_warps=4, **pdl_launch(hs.device)
        )
    return out


@on_input_device
def sparse_gate_up_launch(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, tau: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[B, q, H]`` (unit last stride), ``w_gate`` / ``w_up`` ``[I, H]`` (unit last stride), ``tau`` ``[]``
    float32 -> ``h`` ``[B, q, I]`` in ``x.dtype`` and ``keep`` ``[B, I]`` int8."""
    batch, q_len, _ = x.shape
    if batch == 0 or q_len == 0:
        inter = w_gate.shape[0]
        return _empty((batch, q_len, inter), x.device, x.dtype), _empty((batch, inter), x.device, torch.int8)
    h, keep = _gate_keep(x, w_gate, tau)
    _compact_up(x, w_up, h, kept_channels_launch(keep), compact_out=False)
    return h, keep


@on_input_device
def masked_down_launch(h: torch.Tensor, w_down_t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``h`` ``[B, q, I]`` (unit last stride), ``w_down_t`` ``[I, H]`` (any strides), ``keep`` ``[B, I]`` int8 or
    bool (unit last stride) -> ``[B, q, H]`` in ``h.dtype``."""
    batch, q_len, inter = h.shape
    hidden = w_down_t.shape[1]
    if batch == 0 or q_len == 0:
        return _empty((batch, q_len, hidden), h.device, h.dtype)
    out = _compact_down(
        h.reshape(batch * q_len, inter), w_down_t, kept_channels_launch(keep), compact_h=False
    )
    return out.view(batch, q_len, hidden)


@on_input_device
def sparse_ffn_launch(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, tau: torch.Tensor
) -> torch.Tensor:
    """The whole sparse MLP, one channel list for up and down: ``x`` ``[B, q, H]``, ``w_gate`` / ``w_up`` ``[I, H]``
    (unit last strides), ``w_down_t`` ``[I, H]`` (any strides), ``tau`` ``[]`` float32 -> ``[B, q, H]``. Four
    launches (five with split down sums): gate and mask, channel list, up over the list, down over the list."""
    batch, q_len, hidden = x.shape
    if batch == 0 or q_len == 0:
        return _empty((batch, q_len, hidden), x.device, x.dtype)
    h, keep = _gate_keep(x, w_gate, tau)
    channels = kept_channels_launch(keep)
    hc = _compact_up(x, w_up, h, channels, compact_out=True)
    return _compact_down(hc, w_down_t, channels, compact_h=True).view(batch, q_len, hidden)
