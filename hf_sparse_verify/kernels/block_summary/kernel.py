"""Triton kernels for block summaries: block means of the keys (full build or incremental update) and block
scores against one query row.

Grids depend only on shapes (batch, heads, capacity, q_len, block size); per-row positions are read on the
device, and programs without work mask all their loads and stores.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait
from .naive import max_touched_blocks


@triton.jit
def block_mean_kernel(
    k_ptr,  # [B, H_kv, C, D]
    m_ptr,  # [B, H_kv, NB, D] float32
    pad_ptr,  # [B]
    end_ptr,  # [B]: length (build) or start (update)
    stride_kb,
    stride_kh,
    stride_kc,
    stride_kd,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_md,
    H_KV,
    C,
    NB,
    D,
    Q_LEN,
    BS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPDATE: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per (row, KV head, block): the mean of the block's valid keys.

    Build: block = program_id(0), valid slots pad <= slot < length, every block written (0 when empty).
    Update: block = start // BS + program_id(0), valid slots pad <= slot < start + Q_LEN, only blocks that
    hold a new slot are written.
    """
    pdl_wait(PDL)
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H_KV
    i_h = i_bh % H_KV

    pad = tl.load(pad_ptr + i_b).to(tl.int64)
    if UPDATE:
        start = tl.load(end_ptr + i_b).to(tl.int64)
        end = start + Q_LEN
        blk = start // BS + i_n
        active = (blk * BS < end) & (blk < NB)
    else:
        end = tl.load(end_ptr + i_b).to(tl.int64)
        blk = i_n.to(tl.int64)
        active = blk < NB
    lo = tl.maximum(blk * BS, pad)
    hi = tl.minimum(tl.minimum(blk * BS + BS, end), C)
    # inactive programs get an empty slot range and store nothing (bounds rather than a scalar mask: the
    # interpreter promotes `tensor & scalar` masks to int)
    hi = tl.where(active, hi, lo)
    d_end = tl.where(active, D, 0)

    o_d = tl.arange(0, BLOCK_D)
    mask_d = o_d < D
    p_k = k_ptr + i_b.to(tl.int64) * stride_kb + i_h.to(tl.int64) * stride_kh
    b_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(0, BS, BLOCK_T):
        o_t = blk * BS + t0 + tl.arange(0, BLOCK_T)
        mask_t = (o_t >= lo) & (o_t < hi)
        b_k = tl.load(
            p_k + o_t[:, None] * stride_kc + o_d[None, :] * stride_kd,
            mask=mask_t[:, None] & mask_d[None, :],
            other=0.0,
        ).to(tl.float32)
        b_acc += tl.sum(b_k, axis=0)
    count = tl.maximum(hi - lo, 1).to(tl.float32)
    b_mean = tl.where(hi > lo, b_acc / count, 0.0)

    p_m = m_ptr + i_b.to(tl.int64) * stride_mb + i_h.to(tl.int64) * stride_mh + blk * stride_mn
    tl.store(p_m + o_d * stride_md, b_mean, mask=o_d < d_end)


def _tiles(dim: int, block_size: int) -> tuple[int, int]:
    block_d = next_power_of_2(dim)
    # about 8K key elements per loaded tile: [64, 128] at head_dim 128
    block_t = min(block_size, max(1, 8192 // block_d))
    return block_t, block_d


@on_input_device
def launch_build(
    keys: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int, out: torch.Tensor
):
    """Write the block means of ``keys`` ``[B, H_kv, C, D]`` into ``out`` ``[B, H_kv, NB, D]`` float32."""
    batch, kv_heads, capacity, dim = keys.shape
    nblocks = out.shape[2]
    block_t, block_d = _tiles(dim, block_size)
    block_mean_kernel[(nblocks, batch * kv_heads)](  # blocks on axis 0: no 65535 cap
        keys, out, pad, length,
        *keys.stride(), *out.stride(),
        kv_heads, capacity, nblocks, dim, 0,
        BS=block_size, BLOCK_T=block_t, BLOCK_D=block_d, UPDATE=False,
        num_warps=4,
        **pdl_launch(keys.device),
    )  # fmt: skip


@on_input_device
def launch_update(
    keys: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    block_size: int,
):
    """Recompute in place the blocks of ``mean_key`` that hold slots ``start[b] .. start[b] + q_len - 1``."""
    batch, kv_heads, capacity, dim = keys.shape
    nblocks = mean_key.shape[2]
    block_t, block_d = _tiles(dim, block_size)
    grid = (max_touched_blocks(q_len, block_size), batch * kv_heads)
    block_mean_kernel[grid](
        keys, mean_key, pad, start,
        *keys.stride(), *mean_key.stride(),
        kv_heads, capacity, nblocks, dim, q_len,
        BS=block_size, BLOCK_T=block_t, BLOCK_D=block_d, UPDATE=True,
        num_warps=4,
        **pdl_launch(keys.device),
    )  # fmt: skip


@triton.jit
def score_blocks_kernel(
    q_ptr,  # [Lyr, B, H, D]
    m_ptr,  # [Lyr, B, H_kv, NB, D] float32
    pad_ptr,  # [B]
    len_ptr,  # [B]
    o_ptr,  # [Lyr, B, H_kv, NB] float32
    stride_ql,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_ml,
    stride_mb,
    stride_mh,
    stride_mn,
    stride_md,
    stride_ol,
    stride_ob,
    stride_oh,
    stride_on,
    B,
    H_KV,
    NB,
    D,
    scale,
    G: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program per (layer, row, KV head, tile of BLOCK_N blocks): the summed score of the G query heads.

    The sum over heads of q_g . m equals (sum_g q_g) . m, so the group's queries are summed first.
    """
    pdl_wait(PDL)
    i_lbh = tl.program_id(0)
    i_t = tl.program_id(1)
    i_h = i_lbh % H_KV
    i_b = (i_lbh // H_KV) % B
    i_l = i_lbh // (H_KV * B)

    o_g = tl.arange(0, BLOCK_G)
    o_d = tl.arange(0, BLOCK_D)
    mask_d = o_d < D
    p_q = q_ptr + i_l.to(tl.int64) * stride_ql + i_b.to(tl.int64) * stride_qb
    b_q = tl.load(
        p_q + (i_h * G + o_g)[:, None] * stride_qh + o_d[None, :] * stride_qd,
        mask=(o_g < G)[:, None] & mask_d[None, :],
        other=0.0,
    ).to(tl.float32)
    b_q = tl.sum(b_q, axis=0)  # [BLOCK_D]

    o_n = i_t * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = o_n < NB
    p_m = m_ptr + i_l.to(tl.int64) * stride_ml + i_b.to(tl.int64) * stride_mb + i_h.to(tl.int64) * stride_mh
    b_m = tl.load(
        p_m + o_n[:, None].to(tl.int64) * stride_mn + o_d[None, :] * stride_md,
        mask=mask_n[:, None] & mask_d[None, :],
        other=0.0,
    )
    b_s = tl.sum(b_m * b_q[None, :], axis=1) * scale

    pad = tl.load(pad_ptr + i_b).to(tl.int64)
    length = tl.load(len_ptr + i_b).to(tl.int64)
    valid = ((o_n + 1).to(tl.int64) * BS > pad) & (o_n.to(tl.int64) * BS < length)
    b_s = tl.where(valid, b_s, float("-inf"))

    p_o = o_ptr + i_l.to(tl.int64) * stride_ol + i_b.to(tl.int64) * stride_ob + i_h.to(tl.int64) * stride_oh
    tl.store(p_o + o_n * stride_on, b_s, mask=mask_n)


@on_input_device
def launch_score(
    query: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    length: torch.Tensor,
    block_size: int,
    scale: float,
    out: torch.Tensor,
):
    """Scores of ``mean_key`` ``[Lyr, B, H_kv, NB, D]`` against ``query`` ``[Lyr, B, H, D]`` into ``out``
    ``[Lyr, B, H_kv, NB]`` float32."""
    layers, batch, heads, dim = query.shape
    kv_heads, nblocks = mean_key.shape[2], mean_key.shape[3]
    group = heads // kv_heads
    block_d = next_power_of_2(dim)
    # [32, 128] float32 mean tile per program at head_dim 128
    block_n = max(16, min(128, 4096 // block_d))
    grid = (layers * batch * kv_heads, triton.cdiv(nblocks, block_n))
    score_blocks_kernel[grid](
        query, mean_key, pad, length, out,
        *query.stride(), *mean_key.stride(), *out.stride(),
        batch, kv_heads, nblocks, dim, scale,
        G=group, BS=block_size, BLOCK_G=next_power_of_2(group), BLOCK_N=block_n, BLOCK_D=block_d,
        num_warps=4,
        **pdl_launch(query.device),
    )  # fmt: skip
