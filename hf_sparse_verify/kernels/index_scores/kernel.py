"""The DSA index scores in Triton (`naive.index_scores_naive`): one program per (row, block of ``BLOCK_S`` queries,
block of ``BLOCK_L`` keys) loads its keys once and, for each of its queries, takes the ``[H, D] x [D, BLOCK_L]`` dot,
scales it, applies the ReLU, weights each head and sums over the heads, writing ``BLOCK_L`` float32 scores. Neither
the float32 copy of every key nor the ``[B, S, H, L]`` per-head scores that transformers materialises is made."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_settings, next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: launch settings (not yet swept on a GPU): keys per program and queries per program
TILES = {"block_l": 64, "block_s": 8, "num_warps": 4, "num_stages": 2}


@triton.jit
def _index_scores_fwd(
    q_ptr,  # [B, S, H, D]
    k_ptr,  # [B, L, D] (any strides)
    w_ptr,  # [B, S, H] float32
    o_ptr,  # [B, S, L] float32
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_kl, stride_kd,
    stride_wb, stride_ws, stride_wh,
    stride_ob, stride_os, stride_ol,
    q_len,
    kv_len,
    scale,
    HEADS: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_L: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    s0 = tl.program_id(1) * BLOCK_S
    l0 = tl.program_id(2) * BLOCK_L
    o_h = tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, BLOCK_D)
    o_l = l0 + tl.arange(0, BLOCK_L)
    m_h, m_d, m_l = o_h < HEADS, o_d < DIM, o_l < kv_len
    p_k = k_ptr + b * stride_kb + o_l[:, None] * stride_kl + o_d[None, :] * stride_kd
    b_k = tl.load(p_k, mask=m_l[:, None] & m_d[None, :], other=0.0)  # [BLOCK_L, BLOCK_D]
    if DOT_F32:
        b_k = b_k.to(tl.float32)
    for i in range(BLOCK_S):
        s = s0 + i
        if s < q_len:
            p_q = q_ptr + b * stride_qb + s * stride_qs + o_h[:, None] * stride_qh + o_d[None, :] * stride_qd
            b_q = tl.load(p_q, mask=m_h[:, None] & m_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
            if DOT_F32:
                b_q = b_q.to(tl.float32)
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale  # [BLOCK_H, BLOCK_L]
            b_w = tl.load(w_ptr + b * stride_wb + s * stride_ws + o_h * stride_wh, mask=m_h, other=0.0)
            b_o = tl.sum(tl.maximum(b_s, 0.0) * b_w[:, None], axis=0)  # [BLOCK_L]
            tl.store(o_ptr + b * stride_ob + s * stride_os + o_l * stride_ol, b_o, mask=m_l)


@on_input_device
def index_scores_triton(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """Launch; shapes as `naive.index_scores_naive`. ``keys`` may be a strided view of a larger cache buffer."""
    batch, q_len, heads, dim = q.shape
    kv_len = keys.shape[1]
    out = torch.empty(batch, q_len, kv_len, dtype=torch.float32, device=q.device)
    if q_len == 0 or kv_len == 0:
        return out
    block_s = min(TILES["block_s"], next_power_of_2(q_len))
    grid = (batch, triton.cdiv(q_len, block_s), triton.cdiv(kv_len, TILES["block_l"]))
    dot_f32, precision = dot_settings(q.dtype)
    _index_scores_fwd[grid](
        q, keys, weights, out,
        *q.stride(), *keys.stride(), *weights.stride(), *out.stride(),
        q_len, kv_len, scale,
        HEADS=heads, DIM=dim, BLOCK_H=max(16, next_power_of_2(heads)), BLOCK_D=max(16, next_power_of_2(dim)),
        BLOCK_S=block_s, BLOCK_L=TILES["block_l"], DOT_PRECISION=precision, DOT_F32=dot_f32,
        num_warps=TILES["num_warps"], num_stages=TILES["num_stages"], **pdl_launch(q.device),
    )  # fmt: skip
    return out
