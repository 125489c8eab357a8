"""Triton: weight-only low-bit linear for draft steps (1 to `MAX_ROWS` token rows), reading int8 or packed int4
weights (`naive.pack`) and their scales once per row block.

Grid ``(row blocks, output-channel blocks)``. A program keeps its rows' activations in registers block by block of
``BLOCK_K`` input channels and, for its ``BLOCK_N`` output channels, loads the stored weights of the block:

- int8: ``[BLOCK_N, BLOCK_K]`` values, one ``tl.dot`` with the activations (the values are exact in bf16 / fp16),
  the per-channel scale applied once at the end;
- int4: ``[BLOCK_N, BLOCK_K / 2]`` bytes; the low nibbles and the high ones are scaled by their group's scale in
  registers (the block covers ``BLOCK_K / GROUP`` groups, or lies inside one) and each meets the activations of
  its channels (gathered by `naive.pack`'s layout: byte ``4j + t`` of a block of 32 holds channels ``8t + j`` and
  ``8t + 4 + j``) in a ``tl.dot``. Scaling
  before the dot lets a block span several groups: with groups of 128 a block of 128 channels moves 64 bytes per
  output channel and step, too few to keep the memory busy (one H200: 0.5 TB/s).

Accumulation in float32; the output in the activations' dtype.

For int4 steps of up to `GEMV_ROWS` rows (a draft step of a batch of one or two) `_low_bit_gemv_kernel` does
without ``tl.dot`` (which pads the rows to 16 and wants the dequantized block in the matrix units' layout). It reads
`naive.pack`'s blocks of 32 channels as int32 words and, per word and nibble position, loads four consecutive
activations; a nibble ``n`` becomes the float ``1 + n / 16`` by moving it into the mantissa of 1.0 (a shift and an
and-or, no integer-to-float conversion, which Hopper issues at a quarter of the FMA rate), so a weight costs a shift,
an and-or and a fused multiply-add; the ``1`` and the ``- 8`` are taken out per word (``sum((n - 8) x) = sum((1 +
n / 16) 16 x) - 24 sum(x)``) and the group's scale applied per word. Every operation in its loop is elementwise;
the sums over the input channels are taken once, after it. Measured on one H200 (one row, 8B layers, weights of
one layer replayed, so partly from L2): 24-25 us for 4096 x 14336 against 32 for cuBLAS bf16 and 19-20 for
PyTorch's tinygemm; inside whole draft steps it runs at about a fifth of the copy bandwidth.

Split K: with few output blocks (one row, 4096 output channels: 128 programs of 32 channels) a program per SM
streams a whole row of weights with too few bytes in flight to reach the copy bandwidth. The input channels are
then cut into slices (a third grid axis); each program writes its float32 partial sums to a workspace and
`_low_bit_reduce_kernel` adds the slices in a fixed order (deterministic), adds the bias and casts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, multiprocessors, next_power_of_2, on_input_device, pdl_launch, pdl_wait

_TL_DTYPE = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}

#: launch settings of the ``tl.dot`` kernel, more than `GEMV_ROWS` rows (sweeps set them here)
#: (one H200, 8B shapes, one row: int8 through tl.dot at 64 x 128 read 2.6-3.0 TB/s, 0.62-0.73 of the copy
#: bandwidth, ahead of the elementwise kernel's 2.1-2.6)
TILES = {"block_n": 64, "block_k": 128, "warps": 4, "stages": 3, "split_k": "auto"}
#: int4 steps of up to this many rows run `_low_bit_gemv_kernel`, one program row per token row (one H200, 8B
#: shapes, 2 rows: 45-47 us for 4096 x 14336 against 44-47 through tl.dot; 4 rows: 86 against 44-48)
GEMV_ROWS = 2
#: its launch settings: best summed time over the 8B layer shapes at one row of a sweep of 32 on one H200
#: (`.carry`-staged sweep, 2026-11-28: 8 x 2048 64.8 us, 16 x 1024 65.8)
GEMV_TILES = {"block_n": 8, "block_k": 2048, "warps": 4, "stages": 3, "split_k": "auto"}
#: with ``split_k`` "auto": programs aimed for per streaming multiprocessor (more bytes in flight)
PROGRAMS_PER_SM = 4


@triton.jit
def _group_scales(S, offs_n, n_ok, g, n_groups):
    """The int4 scales ``[N, G]`` of output channels ``offs_n`` for groups ``g`` (0 past the last group)."""
    mask = n_ok[:, None] & (g < n_groups)[None, :]
    return tl.load(S + offs_n[:, None].to(tl.int64) * n_groups + g[None, :], mask=mask, other=0.0)


@triton.jit
def _store_tile(
    acc, B, OUT, WS, offs_m, offs_n, m_ok, n_ok, n_rows, n_out, s_o, HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr
):  # fmt: skip
    """A program's ``[M, N]`` float32 sums: into the workspace ``[slices, n_rows, n_out]`` at its slice when the
    input channels are split (``PARTIAL``), else plus the bias, in the output's dtype."""
    if PARTIAL:
        p_w = WS + (tl.program_id(2) * n_rows + offs_m[:, None]).to(tl.int64) * n_out + offs_n[None, :]
        tl.store(p_w, acc, mask=m_ok[:, None] & n_ok[None, :])
    else:
        if HAS_BIAS:
            acc += tl.load(B + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        p_o = OUT + offs_m[:, None].to(tl.int64) * s_o + offs_n[None, :]
        tl.store(p_o, acc.to(OUT.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _low_bit_linear_kernel(
    X, W, S, B, OUT, WS, n_rows, n_out, n_in, n_groups, k_slice, s_x, s_w, s_o,
    INT4: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr, PARTIAL: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    k_begin = tl.program_id(2) * k_slice
    k_end = tl.minimum(k_begin + k_slice, n_in)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < n_rows
    n_ok = offs_n < n_out
    rows = offs_m[:, None].to(tl.int64) * s_x
    cols = offs_n[:, None].to(tl.int64) * s_w
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if INT4:
        HALF: tl.constexpr = BLOCK_K // 2
        GROUPS: tl.constexpr = BLOCK_K // GROUP if BLOCK_K > GROUP else 1  # groups a block covers
        offs_j = tl.arange(0, HALF)
        offs_g = tl.arange(0, GROUPS)
        for k0 in range(k_begin, k_end, BLOCK_K):
            j = k0 // 2 + offs_j  # byte index in the row
            j_ok = j < n_in // 2
            b_w = tl.load(W + cols + j[None, :], mask=n_ok[:, None] & j_ok[None, :], other=0x88)  # [N, HALF]
            scale = _group_scales(S, offs_n, n_ok, k0 // GROUP + offs_g, n_groups)[
                :, :, None
            ]  # [N, GROUPS, 1]
            low = ((b_w & 0xF).to(tl.int32) - 8).to(tl.float32)
            high = ((b_w >> 4).to(tl.int32) - 8).to(tl.float32)
            low = tl.reshape(tl.reshape(low, [BLOCK_N, GROUPS, HALF // GROUPS]) * scale, [BLOCK_N, HALF])
            high = tl.reshape(tl.reshape(high, [BLOCK_N, GROUPS, HALF // GROUPS]) * scale, [BLOCK_N, HALF])
            # byte j: channel 32 (j // 16) + 8 (j % 4) + (j % 16) // 4 low, 4 more high (`naive.pack`)
            chan = 32 * (j // 16) + 8 * (j % 4) + (j % 16) // 4
            x_low = tl.load(X + rows + chan[None, :], mask=m_ok[:, None] & j_ok[None, :], other=0.0)
            x_high = tl.load(X + rows + chan[None, :] + 4, mask=m_ok[:, None] & j_ok[None, :], other=0.0)
            acc = tl.dot(x_low.to(DOT_DTYPE), tl.trans(low.to(DOT_DTYPE)), acc, input_precision="ieee")
            acc = tl.dot(x_high.to(DOT_DTYPE), tl.trans(high.to(DOT_DTYPE)), acc, input_precision="ieee")
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(k_begin, k_end, BLOCK_K):
            k = k0 + offs_k
            k_ok = k < n_in
            b_w = tl.load(W + cols + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0).to(DOT_DTYPE)
            b_x = tl.load(X + rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc = tl.dot(b_x, tl.trans(b_w), acc, input_precision="ieee")
        acc *= tl.load(S + offs_n, mask=n_ok, other=0.0)[None, :]
    _store_tile(acc, B, OUT, WS, offs_m, offs_n, m_ok, n_ok, n_rows, n_out, s_o, HAS_BIAS, PARTIAL)


@triton.jit
def _nibble_floats(words, i: tl.constexpr):
    """Nibble ``i`` of each int32 of ``words`` (bits ``4i .. 4i + 3``, stored value ``n``) as the float32 ``1 + n /
    16``: the nibble moved into the top four mantissa bits under the exponent of 1.0, one shift and one
    and-or, no integer-to-float conversion (a quarter-rate instruction on Hopper)."""
    if 4 * i <= 19:
        moved = words << (19 - 4 * i)
    else:
        moved = words >> (4 * i - 19)
    return ((moved & 0x00780000) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _low_bit_gemv_kernel(
    X, W, S, B, OUT, WS, n_rows, n_out, n_in, n_groups, k_slice, s_x, s_w, s_o,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    PARTIAL: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One token row (program axis 0) of an int4 layer. ``W``: int32 words ``[N, in / 8]``, per block of 32 input
    channels four words, word ``j`` holding channels ``j + 4 i`` of the block in nibble ``i`` (`naive.pack`).
    Everything inside the loop is elementwise per word; the sums over the input channels are taken once, after it."""
    pdl_wait(PDL)
    BLOCKS: tl.constexpr = BLOCK_K // 32
    k_begin = tl.program_id(2) * k_slice
    k_end = tl.minimum(k_begin + k_slice, n_in)
    row = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_b = tl.arange(0, BLOCKS)
    offs_w = tl.arange(0, 4)
    n_ok = offs_n < n_out
    x_row = X + row.to(tl.int64) * s_x
    cols = offs_n[:, None, None].to(tl.int64) * s_w
    acc = tl.zeros([BLOCK_N, BLOCKS, 4], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        word = k0 // 8 + 4 * offs_b[:, None] + offs_w[None, :]  # [BLOCKS, 4]
        w_ok = word < n_in // 8
        b_w = tl.load(W + cols + word[None, :, :], mask=n_ok[:, None, None] & w_ok[None, :, :], other=0)
        group = (k0 + 32 * offs_b) // GROUP  # [BLOCKS]: a block of 32 lies in one group
        s_ok = n_ok[:, None] & (group < n_groups)[None, :]
        scale = tl.load(S + offs_n[:, None].to(tl.int64) * n_groups + group[None, :], mask=s_ok, other=0.0)
        sums = tl.zeros([BLOCK_N, BLOCKS, 4], dtype=tl.float32)
        x_sum = tl.zeros([BLOCKS, 4], dtype=tl.float32)
        for i in tl.static_range(8):
            chan = k0 + 32 * offs_b[:, None] + 4 * i + offs_w[None, :]  # [BLOCKS, 4]: four consecutive channels
            b_x = tl.load(x_row + chan, mask=w_ok, other=0.0).to(tl.float32)
            x_sum += b_x
            sums += _nibble_floats(b_w, i) * (16.0 * b_x)[None, :, :]  # (1 + n / 16) 16 x = n x + 16 x
        acc += (sums - 24.0 * x_sum[None, :, :]) * scale[:, :, None]  # (n - 8) x, scaled
    total = tl.sum(tl.sum(acc, axis=2), axis=1)  # [N]
    offs_m = row + tl.arange(0, 1)
    _store_tile(total[None, :], B, OUT, WS, offs_m, offs_n, offs_m < n_rows, n_ok, n_rows, n_out, s_o, HAS_BIAS,
                PARTIAL)  # fmt: skip


@triton.jit
def _low_bit_reduce_kernel(
    WS, B, OUT, n_rows, n_out, n_split, s_o, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_out
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(n_split):  # a fixed order: the same sums every call
        acc += tl.load(WS + (s * n_rows + row).to(tl.int64) * n_out + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(B + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + row.to(tl.int64) * s_o + offs, acc.to(OUT.dtype.element_ty), mask=ok)


def block_k(fmt: str, group_size: int, n_in: int, tiles: dict | None = None) -> int:
    """Input channels per loop step: ``tiles`` (`TILES`) ``block_k``, at most the input size rounded up to a power
    of two (and at least 32); for int4 a multiple or a divisor of the group size (its scales apply per group)."""
    bk = max(32, min((tiles or TILES)["block_k"], next_power_of_2(n_in)))
    if fmt == "int4" and bk % group_size and group_size % bk:
        return group_size
    return bk


def split_k(programs: int, n_blocks_k: int, sms: int | None, tiles: dict | None = None) -> int:
    """Slices of the input channels: ``tiles`` (`TILES`) ``split_k`` when it is a number; "auto": enough for about
    `PROGRAMS_PER_SM` programs per multiprocessor (``sms``; 1 where unknown), each slice at least 4 blocks long."""
    chosen = (tiles or TILES)["split_k"]
    if chosen != "auto":
        return max(1, min(int(chosen), n_blocks_k))
    if sms is None:
        return 1
    want = -(-PROGRAMS_PER_SM * sms // programs)
    return max(1, min(want, n_blocks_k // 4))


@on_input_device
def low_bit_linear_launch(x, stored, scales, bias, fmt: str, group_size: int) -> torch.Tensor:
    """``x`` ``[T, in]`` (unit last stride), ``stored`` (`naive.pack`'s layout, unit last stride), ``scales``
    float32 ``[out, groups]`` contiguous, optional ``bias`` ``[out]`` -> ``[T, out]`` in ``x.dtype``."""
    rows, n_in = x.shape
    n_out = stored.shape[0]
    out = torch.empty((rows, n_out), device=x.device, dtype=x.dtype)
    if rows == 0:
        return out
    gemv = fmt == "int4" and rows <= GEMV_ROWS  # it reads the packed int4 rows as int32 words
    tiles = GEMV_TILES if gemv else TILES
    block_m = 1 if gemv else max(16, next_power_of_2(rows))  # the GEMV: one program row per token row
    block_n = tiles["block_n"]
    bk = block_k(fmt, group_size, n_in, tiles)
    grid_m, grid_n, blocks_k = triton.cdiv(rows, block_m), triton.cdiv(n_out, block_n), triton.cdiv(n_in, bk)
    split = split_k(grid_m * grid_n, blocks_k, multiprocessors(x.device), tiles)
    k_slice = triton.cdiv(blocks_k, split) * bk
    split = triton.cdiv(n_in, k_slice)  # no empty slice
    work = torch.empty((split, rows, n_out), device=x.device, dtype=torch.float32) if split > 1 else out
    bias_or_any = bias if bias is not None else scales
    weights = stored.view(torch.int32) if gemv else stored  # [out, in / 8] words (little-endian bytes)
    args = (x, weights, scales, bias_or_any, out, work, rows, n_out, n_in, scales.shape[1], k_slice,
            x.stride(0), weights.stride(0), out.stride(0))  # fmt: skip
    if gemv:
        _low_bit_gemv_kernel[(grid_m, grid_n, split)](
            *args, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=bk, GROUP=group_size, PARTIAL=split > 1,
            num_warps=tiles["warps"], num_stages=tiles["stages"], **pdl_launch(x.device),
        )  # fmt: skip
    else:
        dot_dtype = _TL_DTYPE[torch.float32 if dot_in_float32(x.dtype) else x.dtype]
        _low_bit_linear_kernel[(grid_m, grid_n, split)](
            *args, INT4=fmt == "int4", HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=bk,
            GROUP=group_size, DOT_DTYPE=dot_dtype, PARTIAL=split > 1, num_warps=tiles["warps"],
            num_stages=tiles["stages"], **pdl_launch(x.device),
        )  # fmt: skip
    if split > 1:
        block = 1024
        _low_bit_reduce_kernel[(rows, triton.cdiv(n_out, block))](
            work, bias_or_any, out, rows, n_out, split, out.stride(0), HAS_BIAS=bias is not None, BLOCK=block,
            num_warps=4, **pdl_launch(x.device),
        )  # fmt: skip
    return out
