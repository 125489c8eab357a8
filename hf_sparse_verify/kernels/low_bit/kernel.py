"""Triton: weight-only low-bit linear for draft steps (1 to `MAX_ROWS` token rows), reading int8 or packed int4
weights (`naive.pack`) and their scales once per row block.

Grid ``(row blocks, output-channel blocks)``. A program keeps its rows' activations in registers block by block of
``BLOCK_K`` input channels and, for its ``BLOCK_N`` output channels, loads the stored weights of the block:

- int8: ``[BLOCK_N, BLOCK_K]`` values, one ``tl.dot`` with the activations (the values are exact in bf16 / fp16),
  the per-channel scale applied once at the end;
- int4: ``[BLOCK_N, BLOCK_K / 2]`` bytes; the low nibbles (even input channels) and the high ones (odd channels)
  each meet the matching half of the activations (loaded with stride 2) in a ``tl.dot``; ``BLOCK_K`` is the group
  size (or divides it), so the block's partial sums take their group's scale before they are added up.

Accumulation in float32; the output in the activations' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}

#: launch settings (sweeps set them here)
TILES = {"block_n": 32, "block_k": 128, "warps": 4, "stages": 3}


@triton.jit
def _low_bit_linear_kernel(
    X, W, S, B, OUT, n_rows, n_out, n_in, n_groups, s_x, s_w, s_o,
    INT4: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < n_rows
    n_ok = offs_n < n_out
    rows = offs_m[:, None].to(tl.int64) * s_x
    cols = offs_n[:, None].to(tl.int64) * s_w
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        offs_j = tl.arange(0, HALF)
        for k0 in range(0, n_in, BLOCK_K):
            j = k0 // 2 + offs_j  # byte index in the row
            j_ok = j < n_in // 2
            b_w = tl.load(W + cols + j[None, :], mask=n_ok[:, None] & j_ok[None, :], other=0x88)  # [N, HALF]
            low = ((b_w & 0xF).to(tl.int32) - 8).to(DOT_DTYPE)
            high = ((b_w >> 4).to(tl.int32) - 8).to(DOT_DTYPE)
            x_even = tl.load(X + rows + 2 * j[None, :], mask=m_ok[:, None] & j_ok[None, :], other=0.0)
            x_odd = tl.load(X + rows + 2 * j[None, :] + 1, mask=m_ok[:, None] & j_ok[None, :], other=0.0)
            part = tl.dot(x_even.to(DOT_DTYPE), tl.trans(low), input_precision="ieee")
            part = tl.dot(x_odd.to(DOT_DTYPE), tl.trans(high), part, input_precision="ieee")
            scale = tl.load(S + offs_n.to(tl.int64) * n_groups + k0 // GROUP, mask=n_ok, other=0.0)
            acc += part * scale[None, :]
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(0, n_in, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < n_in
            b_w = tl.load(W + cols + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0).to(DOT_DTYPE)
            b_x = tl.load(X + rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(b_x, tl.trans(b_w), acc, input_precision="ieee")
        acc *= tl.load(S + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    p_o = OUT + offs_m[:, None].to(tl.int64) * s_o + offs_n[None, :]
    tl.store(p_o, acc.to(OUT.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def block_k(fmt: str, group_size: int) -> int:
    """Input channels per loop step: int8 `TILES` ``block_k``; int4 the group size, or `TILES` ``block_k`` where
    that divides the group."""
    if fmt == "int8" or group_size <= TILES["block_k"]:
        return TILES["block_k"] if fmt == "int8" else group_size
    return TILES["block_k"] if group_size % TILES["block_k"] == 0 else group_size


@on_input_device
def low_bit_linear_launch(x, stored, scales, bias, fmt: str, group_size: int) -> torch.Tensor:
    """``x`` ``[T, in]`` (unit last stride), ``stored`` (`naive.pack`'s layout, unit last stride), ``scales``
    float32 ``[out, groups]`` contiguous, optional ``bias`` ``[out]`` -> ``[T, out]`` in ``x.dtype``."""
    rows, n_in = x.shape
    n_out = stored.shape[0]
    out = torch.empty((rows, n_out), device=x.device, dtype=x.dtype)
    if rows == 0:
        return out
    dot_dtype = _TL_DTYPE[torch.float32 if dot_in_float32(x.dtype) else x.dtype]
    block_m = max(16, next_power_of_2(rows))
    block_n = TILES["block_n"]
    _low_bit_linear_kernel[(triton.cdiv(rows, block_m), triton.cdiv(n_out, block_n))](
        x, stored, scales, bias if bias is not None else scales, out, rows, n_out, n_in, scales.shape[1],
        x.stride(0), stored.stride(0), out.stride(0),
        INT4=fmt == "int4", HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k(fmt, group_size), GROUP=group_size, DOT_DTYPE=dot_dtype,
        num_warps=TILES["warps"], num_stages=TILES["stages"], **pdl_launch(x.device),
    )  # fmt: skip
    return out
