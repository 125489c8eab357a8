"""Triton kernels of the Llama-family attention input for decode and verify steps.

- ``_qkv_proj_kernel``, grid ``(T / BLOCK_M, (N_q + 2 N_kv) / BLOCK_N)``: ``x @ [w_q; w_k; w_v]^T`` (+ biases)
  without concatenating the weights: each program owns ``BLOCK_N`` output columns of one of the three projections
  (its tile index says which) and reads those weight rows once for all ``T <= BLOCK_M`` rows, GEMV-style. Products
  accumulate in float32; outputs are rounded to ``x.dtype``, as ``F.linear`` rounds them.
- ``_linear_kernel``, grid ``(1, N / BLOCK_N)``: ``x @ w^T`` (+ bias) for one weight, the same tile code
  (`row_linear`: the attention output projection, one launch where cuBLAS runs split-K plus a reduction).
- ``_rope_kernel``, grid ``(T, H_q + H_kv)``: one head of one row: optional RMSNorm over the head (float32
  statistics, normalized value rounded to the activation dtype, times the weight, as transformers' RMSNorm), then
  ``x * cos + rotate_half(x) * sin`` with each product rounded to the activation dtype before the sum, as eager
  rounds them. The head's two halves are loaded separately, so ``rotate_half`` is a swap of registers.

Grids depend on shapes only (no host sync; CUDA-graph capturable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait
from .tiles import TILES, linear_block_n, proj_block_n  # noqa: F401 - sweeps set TILES here

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


@triton.jit
def _project_tile(
    X, W, B, OUT, n0, n_rows, n_hidden, s_x, s_w, s_o,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < n_rows
    b_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, n_hidden, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < n_hidden
        p_x = X + offs_m[:, None].to(tl.int64) * s_x + k[None, :]
        b_x = tl.load(p_x, mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_w = tl.load(W + offs_n[:, None] * s_w + k[None, :], mask=k_ok[None, :], other=0.0).to(DOT_DTYPE)
        b_acc = tl.dot(b_x, tl.trans(b_w), b_acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        b_acc += tl.load(B + offs_n).to(tl.float32)[None, :]
    p_o = OUT + offs_m[:, None].to(tl.int64) * s_o + offs_n[None, :]
    tl.store(p_o, b_acc.to(OUT.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _qkv_proj_kernel(
    X, WQ, WK, WV, BQ, BK, BV, OQ, OK, OV,
    n_rows, n_hidden, tiles_q, tiles_k,
    s_x, s_wq, s_wk, s_wv, s_oq, s_ok, s_ov,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    tile = tl.program_id(1)
    if tile < tiles_q:
        _project_tile(X, WQ, BQ, OQ, tile * BLOCK_N, n_rows, n_hidden, s_x, s_wq, s_oq,
                      HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    elif tile < tiles_q + tiles_k:
        _project_tile(X, WK, BK, OK, (tile - tiles_q) * BLOCK_N, n_rows, n_hidden, s_x, s_wk, s_ok,
                      HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip
    else:
        _project_tile(X, WV, BV, OV, (tile - tiles_q - tiles_k) * BLOCK_N, n_rows, n_hidden, s_x, s_wv, s_ov,
                      HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip


@triton.jit
def _linear_kernel(
    X, W, B, OUT, n_rows, n_hidden, s_x, s_w, s_o,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    _project_tile(X, W, B, OUT, tl.program_id(1) * BLOCK_N, n_rows, n_hidden, s_x, s_w, s_o,
                  HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, DOT_DTYPE, DOT_PRECISION)  # fmt: skip


@triton.jit
def _round(x, dtype: tl.constexpr):
    """``x`` rounded to ``dtype`` and back to float32 (where eager stores an intermediate in the activation
    dtype)."""
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rope_head(
    SRC, DST, COS, SIN, NW, eps,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    dtype = DST.dtype.element_ty
    offs = tl.arange(0, BLOCK_H)
    ok = offs < HALF
    b_lo = tl.load(SRC + offs, mask=ok, other=0.0).to(tl.float32)  # [HALF] first half of the head
    b_hi = tl.load(SRC + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    if NORM:
        variance = (tl.sum(b_lo * b_lo, axis=0) + tl.sum(b_hi * b_hi, axis=0)) / (2 * HALF)
        r = tl.math.rsqrt(variance + eps)
        b_lo = _round(tl.load(NW + offs, mask=ok, other=0.0).to(tl.float32) * _round(b_lo * r, dtype), dtype)
        b_hi = _round(
            tl.load(NW + HALF + offs, mask=ok, other=0.0).to(tl.float32) * _round(b_hi * r, dtype), dtype
        )
    c_lo = tl.load(COS + offs, mask=ok, other=0.0).to(tl.float32)
    c_hi = tl.load(COS + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    s_lo = tl.load(SIN + offs, mask=ok, other=0.0).to(tl.float32)
    s_hi = tl.load(SIN + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    # rotate_half(x) = (-x_hi, x_lo)
    o_lo = _round(b_lo * c_lo, dtype) - _round(b_hi * s_lo, dtype)
    o_hi = _round(b_hi * c_hi, dtype) + _round(b_lo * s_hi, dtype)
    tl.store(DST + offs, o_lo.to(dtype), mask=ok)
    tl.store(DST + HALF + offs, o_hi.to(dtype), mask=ok)


@triton.jit
def _rope_kernel(
    Q, K, COS, SIN, QW, KW, OQ, OK, V, KC, VC, SLOTS,
    heads_q, s_q, s_k, s_c, s_s, s_oq, s_ok, s_v, q_len, s_cb, s_ch, s_ct, s_sb, eps,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, Q_NORM: tl.constexpr, K_NORM: tl.constexpr,
    TO_CACHE: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    p_cos, p_sin = COS + row * s_c, SIN + row * s_s
    if head < heads_q:
        _rope_head(Q + row * s_q + head * 2 * HALF, OQ + row * s_oq + head * 2 * HALF, p_cos, p_sin, QW, eps,
                   HALF, BLOCK_H, Q_NORM)  # fmt: skip
    else:
        kv = head - heads_q
        if (
            TO_CACHE
        ):  # row = b * q_len + i goes to slot SLOTS[b, i] of the [B, H_kv, C, D] caches, v copied as is
            b = row // q_len
            slot = tl.load(SLOTS + b * s_sb + row % q_len).to(tl.int64)
            at = b * s_cb + kv * s_ch + slot * s_ct
            _rope_head(K + row * s_k + kv * 2 * HALF, KC + at, p_cos, p_sin, KW, eps,
                       HALF, BLOCK_H, K_NORM)  # fmt: skip
            offs = tl.arange(0, BLOCK_H)
            ok = offs < HALF
            p_v = V + row * s_v + kv * 2 * HALF
            tl.store(VC + at + offs, tl.load(p_v + offs, mask=ok).to(VC.dtype.element_ty), mask=ok)
            tl.store(
                VC + at + HALF + offs, tl.load(p_v + HALF + offs, mask=ok).to(VC.dtype.element_ty), mask=ok
            )
        else:
            _rope_head(K + row * s_k + kv * 2 * HALF, OK + row * s_ok + kv * 2 * HALF, p_cos, p_sin, KW, eps,
                       HALF, BLOCK_H, K_NORM)  # fmt: skip


def _empty(shape, device, dtype) -> torch.Tensor:
    """Output allocation (tests poison it with NaN)."""
    return torch.empty(shape, device=device, dtype=dtype)


def _dot(dtype: torch.dtype):
    dot_dtype = _TL_DTYPE[torch.float32 if dot_in_float32(dtype) else dtype]
    return dot_dtype, "ieee" if dot_dtype == tl.float32 else "tf32"  # tf32 only matters for float32 operands


@on_input_device
def qkv_proj_launch(x, w_q, w_k, w_v, b_q, b_k, b_v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` ``[T, H]`` (unit last stride), ``w_*`` ``[N_*, H]`` (unit last stride; `proj_block_n` not None),
    optional biases (all or none) -> ``[T, N_q]``, ``[T, N_kv]``, ``[T, N_kv]`` in ``x.dtype``."""
    rows, hidden = x.shape
    n_q, n_kv = w_q.shape[0], w_k.shape[0]
    q, k, v = (_empty((rows, n), x.device, x.dtype) for n in (n_q, n_kv, n_kv))
    if rows == 0:
        return q, k, v
    bn = proj_block_n(n_q, n_kv)
    bm = max(16, next_power_of_2(rows))
    bk = min(TILES["proj_k"], max(16, next_power_of_2(hidden)))
    dot_dtype, precision = _dot(x.dtype)
    has_bias = b_q is not None
    tiles_q, tiles_k = n_q // bn, n_kv // bn
    _qkv_proj_kernel[(triton.cdiv(rows, bm), tiles_q + 2 * tiles_k)](
        x, w_q, w_k, w_v,
        b_q if has_bias else w_q, b_k if has_bias else w_k, b_v if has_bias else w_v,
        q, k, v,
        rows, hidden, tiles_q, tiles_k,
        x.stride(0), w_q.stride(0), w_k.stride(0), w_v.stride(0), q.stride(0), k.stride(0), v.stride(0),
        HAS_BIAS=has_bias, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=TILES["num_warps"], num_stages=TILES["num_stages"],
        **pdl_launch(x.device),
    )  # fmt: skip
    return q, k, v


@on_input_device
def row_linear_launch(x, weight, bias) -> torch.Tensor:
    """``x`` ``[T, K]`` (unit last stride), ``weight`` ``[N, K]`` (unit last stride; `linear_block_n` not None),
    optional ``bias`` ``[N]`` -> ``[T, N]`` in ``x.dtype``."""
    rows, hidden = x.shape
    out = _empty((rows, weight.shape[0]), x.device, x.dtype)
    if rows == 0:
        return out
    bn = linear_block_n(weight.shape[0])
    bk = min(TILES["out_k"], max(16, next_power_of_2(hidden)))
    dot_dtype, precision = _dot(x.dtype)
    _linear_kernel[(triton.cdiv(rows, max(16, next_power_of_2(rows))), weight.shape[0] // bn)](
        x, weight, bias if bias is not None else weight, out, rows, hidden, x.stride(0), weight.stride(0),
        out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=max(16, next_power_of_2(rows)), BLOCK_N=bn, BLOCK_K=bk,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=TILES["out_warps"], num_stages=TILES["out_stages"],
        **pdl_launch(x.device),
    )  # fmt: skip
    return out


@on_input_device
def rope_qk_launch(
    q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[T, H_q * D]``, ``k`` ``[T, H_kv * D]`` (unit last stride), ``cos`` / ``sin`` ``[T, D]`` (unit last
    stride) -> ``[T, H_q, D]``, ``[T, H_kv, D]`` contiguous, in ``q.dtype``."""
    rows = q.shape[0]
    heads_q, heads_kv = q.shape[1] // head_dim, k.shape[1] // head_dim
    out_q = _empty((rows, heads_q, head_dim), q.device, q.dtype)
    out_k = _empty((rows, heads_kv, head_dim), q.device, q.dtype)
    if rows == 0:
        return out_q, out_k
    _launch_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, out_q, out_k, None)
    return out_q, out_k


def _launch_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, out_q, out_k, cache) -> None:
    """``cache``: None (keys to ``out_k``) or ``(v, key_cache, value_cache, slots)`` (keys and values to the
    caches' ``slots``; ``out_k`` unused)."""
    rows = q.shape[0]
    heads_q, heads_kv = q.shape[1] // head_dim, k.shape[1] // head_dim
    half = head_dim // 2
    v, key_cache, value_cache, slots = cache if cache is not None else (k, q, q, q)
    s_c = key_cache.stride()[:3] if cache is not None else (0, 0, 0)
    _rope_kernel[(rows, heads_q + heads_kv)](
        q, k, cos, sin,
        q_norm_weight if q_norm_weight is not None else q, k_norm_weight if k_norm_weight is not None else k,
        out_q, out_k, v, key_cache, value_cache, slots,
        heads_q, q.stride(0), k.stride(0), cos.stride(0), sin.stride(0), out_q.stride(0), out_k.stride(0),
        v.stride(0), slots.shape[1] if cache is not None else 1, *s_c,
        slots.stride(0) if cache is not None else 0, eps,
        HALF=half, BLOCK_H=next_power_of_2(half), Q_NORM=q_norm_weight is not None,
        K_NORM=k_norm_weight is not None, TO_CACHE=cache is not None, num_warps=1 if head_dim <= 128 else 2,
        **pdl_launch(q.device),
    )  # fmt: skip


@on_input_device
def rope_qk_cache_launch(
    q, k, v, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, key_cache, value_cache, slots
) -> torch.Tensor:
    """As `rope_qk_launch`, with the rotated keys and the values ``v`` ``[T, H_kv * D]`` (unit last stride) written to
    ``key_cache`` / ``value_cache`` ``[B, H_kv, C, D]`` (same strides, unit last) at ``slots`` ``[B, T / B]``;
    returns the rotated queries ``[T, H_q, D]``."""
    rows = q.shape[0]
    out_q = _empty((rows, q.shape[1] // head_dim, head_dim), q.device, q.dtype)
    if rows:
        cache = (v, key_cache, value_cache, slots)
        _launch_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, out_q, out_q, cache)
    return out_q
