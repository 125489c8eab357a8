"""Triton kernels of the gated MLP for the few rows of decode and verify steps.

- ``_gated_act_kernel``, grid ``(T / BLOCK_M, I / BLOCK_N)``: ``h = silu(x @ w_gate^T) * (x @ w_up^T)``. One program
  owns a tile of ``BLOCK_N`` channels and reads its gate and up rows in the same pass over ``H``; for ``T <=
  BLOCK_M`` (every decode and verify step: up to 64 rows) each weight is read exactly once, GEMV-style. Products
  accumulate in float32; gate, up, ``silu(gate)`` and the product are rounded to ``x.dtype`` where eager rounds them.
- ``_sparse_up_kernel``, grid ``(B, I / BLOCK_C)``: for the kept channels of row ``b`` (compacted ids ``index[b,
  :count[b]]``) ``h[b, t, s] = act[b, t, c_s] * (x[b, t] . w_up[c_s])``, stored compacted. Only the kept rows of
  ``w_up`` are read; programs past ``count[b]`` return at once.
- ``_sparse_down_kernel``, grid ``(B, H / BLOCK_N, SPLIT)``: ``partial[p, b, t] = sum_s h[b, t, s] * w_down_t[c_s]``
  over split ``p`` of the row's kept channels (the ``count[b]`` kept slots are cut into ``SPLIT`` equal parts at run
  time, so every split has work whatever the sparsity); the splits are summed in float32 afterwards, in order
  (deterministic, no atomics). Only the kept rows of ``w_down_t = w_down.T`` are read.

Every grid depends on shapes only (no host sync; CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: tile settings (chosen for decode/verify row counts, not yet tuned on a GPU)
TILES = {"act_n": 32, "act_k": 128, "up_c": 32, "up_k": 128, "down_n": 64, "down_s": 64, "num_warps": 4}
#: the down kernel splits the kept channels until about this many programs run
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
def _sparse_up_kernel(
    X, ACT, WU, INDEX, COUNT, H,
    q_len, n_hidden, s_xb, s_xt, s_ab, s_at, s_wu, s_ib, s_hb, s_ht,
    BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    c0 = tl.program_id(1) * BLOCK_C
    count = tl.load(COUNT + b)
    if c0 >= count:
        return
    offs_s = c0 + tl.arange(0, BLOCK_C)
    s_ok = offs_s < count
    b_idx = tl.load(INDEX + b * s_ib + offs_s, mask=s_ok, other=0).to(tl.int64)  # [BLOCK_C] channel ids
    offs_t = tl.arange(0, BLOCK_Q)
    t_ok = offs_t < q_len
    offs_k = tl.arange(0, BLOCK_K)
    b_up = tl.zeros([BLOCK_Q, BLOCK_C], dtype=tl.float32)
    for k0 in range(0, n_hidden, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < n_hidden
        p_x = X + b * s_xb + offs_t[:, None] * s_xt + k[None, :]
        b_x = tl.load(p_x, mask=t_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        p_w = WU + b_idx[:, None] * s_wu + k[None, :]
        b_w = tl.load(p_w, mask=s_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_up = tl.dot(b_x, tl.trans(b_w), b_up, input_precision=DOT_PRECISION)
    dtype = H.dtype.element_ty
    ok = t_ok[:, None] & s_ok[None, :]
    b_act = tl.load(ACT + b * s_ab + offs_t[:, None] * s_at + b_idx[None, :], mask=ok, other=0.0)
    b_h = b_act.to(tl.float32) * b_up.to(dtype).to(tl.float32)
    tl.store(H + b * s_hb + offs_t[:, None] * s_ht + offs_s[None, :], b_h.to(dtype), mask=ok)


@triton.jit
def _sparse_down_kernel(
    H, WD, INDEX, COUNT, PART,
    q_len, n_hidden, s_hb, s_ht, s_wd_c, s_wd_h, s_ib, s_pp, s_pb, s_pt,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    n_ok = offs_n < n_hidden
    count = tl.load(COUNT + b)
    chunk = tl.cdiv(tl.cdiv(count, SPLIT), BLOCK_S) * BLOCK_S  # kept slots per split, whole tiles
    lo = split * chunk
    hi = tl.minimum(lo + chunk, count)
    offs_t = tl.arange(0, BLOCK_Q)
    t_ok = offs_t < q_len
    offs_s = tl.arange(0, BLOCK_S)
    b_y = tl.zeros([BLOCK_Q, BLOCK_N], dtype=tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < hi
        b_idx = tl.load(INDEX + b * s_ib + s, mask=s_ok, other=0).to(tl.int64)
        p_h = H + b * s_hb + offs_t[:, None] * s_ht + s[None, :]
        b_h = tl.load(p_h, mask=t_ok[:, None] & s_ok[None, :], other=0.0).to(DOT_DTYPE)
        p_w = WD + b_idx[:, None] * s_wd_c + offs_n[None, :].to(tl.int64) * s_wd_h
        b_w = tl.load(p_w, mask=s_ok[:, None] & n_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_y = tl.dot(b_h, b_w, b_y, input_precision=DOT_PRECISION)
    p_o = PART + split * s_pp + b * s_pb + offs_t[:, None] * s_pt + offs_n[None, :]
    tl.store(p_o, b_y, mask=t_ok[:, None] & n_ok[None, :])  # zeros where the split has no slot


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


def down_splits(batch: int, hidden: int, inter: int) -> int:
    """How many parts the down kernel cuts each row's kept channels into (shapes only)."""
    tiles = batch * triton.cdiv(hidden, _block(hidden, TILES["down_n"]))
    return max(1, min(triton.cdiv(DOWN_PROGRAMS, tiles), triton.cdiv(inter, 4 * TILES["down_s"])))


@on_input_device
def sparse_up_down_launch(
    x: torch.Tensor,
    act: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    index: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """``x`` ``[B, q, H]`` and ``act`` ``[B, q, I]`` (unit last stride), ``w_up`` ``[I, H]`` (unit last stride),
    ``w_down_t`` ``[I, H]`` (any strides), ``index`` ``[B, I]`` / ``count`` ``[B]`` int32 contiguous ->
    ``[B, q, H]`` in ``x.dtype``."""
    batch, q_len, hidden = x.shape
    inter = w_up.shape[0]
    device = x.device
    if batch == 0 or q_len == 0:
        return _empty(x.shape, device, x.dtype)
    dot_dtype, precision = _dot(x.dtype)
    bq = _block(q_len, 64)
    h = _empty((batch, q_len, inter), device, x.dtype)  # compacted: slot s of row b holds channel index[b, s]
    bc = _block(inter, TILES["up_c"])
    _sparse_up_kernel[(batch, triton.cdiv(inter, bc))](
        x, act, w_up, index, count, h,
        q_len, hidden, x.stride(0), x.stride(1), act.stride(0), act.stride(1), w_up.stride(0), index.stride(0),
        h.stride(0), h.stride(1),
        BLOCK_Q=bq, BLOCK_C=bc, BLOCK_K=_block(hidden, TILES["up_k"]), DOT_DTYPE=dot_dtype,
        DOT_PRECISION=precision, num_warps=TILES["num_warps"],
        **pdl_launch(x.device),
    )  # fmt: skip
    split = down_splits(batch, hidden, inter)
    part = _empty((split, batch, q_len, hidden), device, torch.float32)
    bn = _block(hidden, TILES["down_n"])
    _sparse_down_kernel[(batch, triton.cdiv(hidden, bn), split)](
        h, w_down_t, index, count, part,
        q_len, hidden, h.stride(0), h.stride(1), w_down_t.stride(0), w_down_t.stride(1), index.stride(0),
        part.stride(0), part.stride(1), part.stride(2),
        BLOCK_Q=bq, BLOCK_N=bn, BLOCK_S=_block(inter, TILES["down_s"]), SPLIT=split, DOT_DTYPE=dot_dtype,
        DOT_PRECISION=precision, num_warps=TILES["num_warps"],
        **pdl_launch(h.device),
    )  # fmt: skip
    return part.sum(0).to(x.dtype)
