"""Triton: the gated delta rule over a verify window in one launch per layer, reading the state before the window
from the cache's ring of states and writing the state after every token back into it.

Grid ``(B * H_v, D_v / BLOCK_V)``. A program holds its ``[D_k, BLOCK_V]`` slice of the state in registers for the
whole window: it reads row ``b``'s state at ring slot ``(start[b] - 1) mod R`` once, and per token loads that
token's query and key (of its value head's key head, l2-normalised in float32 in the program), value slice, decay
and beta; decays the state, applies the delta update, writes the output slice and the state slice after the token
at slot ``(start[b] + t) mod R`` (with ``EVERY=False`` only the last token's: the least any exact recurrence
writes, kept for measuring what the per-token states cost). The state is read once and written ``W`` times where
a recurrence of one token per call would read and write it ``W`` times each. Float32 arithmetic; the output in the
values' dtype, the states in the ring's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait


@triton.jit
def _gated_delta_ring_kernel(
    Q, K, V, G, BETA, RING, START, OUT,
    W, R, H_V, H_K, D_K, D_V, scale,
    s_qb, s_qw, s_qh, s_kb, s_kw, s_kh, s_vb, s_vw, s_vh, s_gb, s_gw, s_bb, s_bw,
    s_rb, s_rr, s_rh, s_rk, s_ob, s_ow, s_oh,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, EVERY: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    i_bh = tl.program_id(0)
    i_v = tl.program_id(1)
    b = (i_bh // H_V).to(tl.int64)
    h = i_bh % H_V
    hk = h // (H_V // H_K)
    o_k = tl.arange(0, BLOCK_K)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k = o_k < D_K
    m_v = o_v < D_V
    m_s = m_k[:, None] & m_v[None, :]
    start = tl.load(START + b).to(tl.int64)
    p_row = RING + b * s_rb + h * s_rh + o_k[:, None] * s_rk + o_v[None, :]
    state = tl.load(p_row + ((start - 1 + R) % R) * s_rr, mask=m_s, other=0.0).to(tl.float32)
    for t in range(W):
        q = tl.load(Q + b * s_qb + t * s_qw + hk * s_qh + o_k, mask=m_k, other=0.0).to(tl.float32)
        k = tl.load(K + b * s_kb + t * s_kw + hk * s_kh + o_k, mask=m_k, other=0.0).to(tl.float32)
        v = tl.load(V + b * s_vb + t * s_vw + h * s_vh + o_v, mask=m_v, other=0.0).to(tl.float32)
        g = tl.load(G + b * s_gb + t * s_gw + h).to(tl.float32)
        beta = tl.load(BETA + b * s_bb + t * s_bw + h).to(tl.float32)
        q = q * tl.math.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
        k = k * tl.math.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
        state = state * tl.exp(g)
        memory = tl.sum(state * k[:, None], axis=0)  # [BLOCK_V]
        delta = (v - memory) * beta
        state = state + k[:, None] * delta[None, :]
        out = tl.sum(state * q[:, None], axis=0)
        tl.store(OUT + b * s_ob + t * s_ow + h * s_oh + o_v, out.to(OUT.dtype.element_ty), mask=m_v)
        if EVERY or t == W - 1:
            tl.store(p_row + ((start + t) % R) * s_rr, state.to(RING.dtype.element_ty), mask=m_s)


@on_input_device
def launch(query, key, value, g, beta, ring, start, every_state: bool) -> torch.Tensor:
    """`gated_delta_ring` on the Triton kernel (inputs checked by the op)."""
    batch, width, heads_v, d_v = value.shape
    heads_k, d_k = key.shape[2], key.shape[3]
    out = torch.empty_like(value)
    block_k = next_power_of_2(d_k)
    block_v = min(next_power_of_2(d_v), max(16, 8192 // block_k))  # at most 8K state floats per program
    grid = (batch * heads_v, triton.cdiv(d_v, block_v))
    _gated_delta_ring_kernel[grid](
        query, key, value, g, beta, ring, start, out,
        width, ring.shape[1], heads_v, heads_k, d_k, d_v, d_k**-0.5,
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), g.stride(0), g.stride(1), beta.stride(0),
        beta.stride(1), ring.stride(0), ring.stride(1), ring.stride(2), ring.stride(3), out.stride(0),
        out.stride(1), out.stride(2),
        BLOCK_K=block_k, BLOCK_V=block_v, EVERY=every_state, **pdl_launch(value.device),
    )  # fmt: skip
    return out
