"""Sparse MLA attention in Triton over a step's DSA selections, for both schedules of `op.SCHEDULES`.

One program per (row, block of ``BLOCK_H`` heads, split) serves every query of the row for those heads
(``BLOCK_H * q`` rows of one tile) and walks its share of the row's list of slots, each with a bitmask of the queries
that chose it: under the merged schedule the row's union (`naive.merged_selection`), each union slot's latent and
rotary rows loaded once per head block and a query's logits masked by its bit; under the per-query schedule one
query per row (`naive.per_query_selection`, ``kv_share`` rows reading one cache row). The latent row is both the key
(with the rotary part) and the value, as in absorbed MLA. Online softmax in float32; with several splits a second
kernel merges the parts by their log-sum-exp. The grid depends on shapes only; each row's count is read on the
device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import (
    dot_settings,
    merge_splits,
    multiprocessors,
    next_power_of_2,
    on_input_device,
    online_softmax_block,
    pdl_launch,
    pdl_wait,
)

#: launch settings; ``rows``: tile rows (heads x queries) a program aims for; ``programs_per_sm``: the default split
#: count's aim. Not yet swept on a GPU.
#: the best one-query setting of an 18-point sweep at 1 x 16K on an H100 (V3.2 layer, bf16; `bench_dsa.py --sweep`,
#: record ``deepseek-v3.2-layer`` of ``dsa.json``'s sweep run): 8 one-query calls 115 us against 119 us for 32 x 32 x 4
#: warps; the merged 8-query schedule's best there was 64 rows x 64 slots x 8 warps (179 us).
TILES = {"rows": 32, "block_n": 64, "num_warps": 8, "num_stages": 2, "programs_per_sm": 2}
MIN_SLOTS_PER_SPLIT = 64
MAX_SPLITS = 32


@triton.jit
def _sparse_mla_fwd(
    ql_ptr,  # [B, q, H, R]
    qr_ptr,  # [B, q, H, P]
    lat_ptr,  # [B, C, R] (any strides)
    rot_ptr,  # [B, C, P]
    slots_ptr,  # [B, U] int32
    bits_ptr,  # [B, U] int32
    count_ptr,  # [B] int32
    o_ptr,  # [B, q, H, R] (one split) or partials [B * NHB, S, BLOCK_M, R] float32
    lse_ptr,  # [B * NHB, S, BLOCK_M] float32
    stride_qlb, stride_qlt, stride_qlh, stride_qlr,
    stride_qrb, stride_qrt, stride_qrh, stride_qrp,
    stride_lb, stride_lc, stride_lr,
    stride_rb, stride_rc, stride_rp,
    stride_sb,
    stride_ob, stride_ot, stride_oh, stride_or,
    scale_log2,
    n_union,
    num_splits,
    HEADS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    Q_LEN: tl.constexpr,
    KV_SHARE: tl.constexpr,
    LAT_DIM: tl.constexpr,
    ROT_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HEAD_BLOCKS
    h0 = (pid % HEAD_BLOCKS) * BLOCK_H

    count = tl.minimum(tl.maximum(tl.load(count_ptr + b), 0), n_union)
    chunk = tl.cdiv(count, num_splits)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, count)

    o_m = tl.arange(0, BLOCK_M)  # tile row m = head g * q + query i
    g = o_m // Q_LEN
    i = o_m % Q_LEN
    h = h0 + g
    m_ok = (g < BLOCK_H) & (h < HEADS)
    o_r = tl.arange(0, BLOCK_R)
    r_ok = o_r < LAT_DIM
    o_p = tl.arange(0, BLOCK_P)
    p_ok = o_p < ROT_DIM

    b64 = b.to(tl.int64)
    p_ql = (
        ql_ptr
        + b64 * stride_qlb
        + i[:, None] * stride_qlt
        + h[:, None] * stride_qlh
        + o_r[None, :] * stride_qlr
    )
    b_ql = tl.load(p_ql, mask=m_ok[:, None] & r_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_R]
    p_qr = (
        qr_ptr
        + b64 * stride_qrb
        + i[:, None] * stride_qrt
        + h[:, None] * stride_qrh
        + o_p[None, :] * stride_qrp
    )
    b_qr = tl.load(p_qr, mask=m_ok[:, None] & p_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_P]
    if DOT_F32:
        b_ql = b_ql.to(tl.float32)
        b_qr = b_qr.to(tl.float32)
    cache_row = (b // KV_SHARE).to(tl.int64)  # rows of the step that read one cache row (per-query schedule)
    p_lat = lat_ptr + cache_row * stride_lb
    p_rot = rot_ptr + cache_row * stride_rb

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = o_n < hi
        slot = tl.load(slots_ptr + b64 * stride_sb + o_n, mask=n_ok, other=0).to(tl.int64)
        bit = tl.load(bits_ptr + b64 * stride_sb + o_n, mask=n_ok, other=0)
        b_lat = tl.load(
            p_lat + slot[:, None] * stride_lc + o_r[None, :] * stride_lr,
            mask=n_ok[:, None] & r_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_R]
        b_rot = tl.load(
            p_rot + slot[:, None] * stride_rc + o_p[None, :] * stride_rp,
            mask=n_ok[:, None] & p_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_P]
        if DOT_F32:
            b_lat = b_lat.to(tl.float32)
            b_rot = b_rot.to(tl.float32)
        b_s = tl.dot(b_ql, tl.trans(b_lat), input_precision=DOT_PRECISION)
        b_s = tl.dot(b_qr, tl.trans(b_rot), acc=b_s, input_precision=DOT_PRECISION) * scale_log2
        attend = ((bit[None, :] >> i[:, None]) & 1) != 0  # [BLOCK_M, BLOCK_N]: query i chose the slot
        b_s = tl.where(attend & n_ok[None, :], b_s, float("-inf"))
        b_p, alpha, b_m, b_l = online_softmax_block(b_s, b_m, b_l)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_lat.dtype), b_lat, input_precision=DOT_PRECISION)

    has = b_l > 0
    b_o = b_acc / tl.where(has, b_l, 1.0)[:, None]
    if SINGLE_SPLIT:
        p_o = (
            o_ptr
            + b64 * stride_ob
            + i[:, None] * stride_ot
            + h[:, None] * stride_oh
            + o_r[None, :] * stride_or
        )
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & r_ok[None, :])
    else:
        part = pid.to(tl.int64) * num_splits + split
        tl.store(o_ptr + (part * BLOCK_M + o_m[:, None]) * LAT_DIM + o_r[None, :], b_o, mask=r_ok[None, :])
        b_lse = tl.where(has, b_m + tl.log2(tl.where(has, b_l, 1.0)), float("-inf"))
        tl.store(lse_ptr + part * BLOCK_M + o_m, b_lse)


@triton.jit
def _sparse_mla_merge(
    po_ptr,  # [B * NHB, S, BLOCK_M, R] float32
    lse_ptr,  # [B * NHB, S, BLOCK_M] float32
    o_ptr,  # [B, q, H, R]
    stride_ob, stride_ot, stride_oh, stride_or,
    num_splits,
    HEADS: tl.constexpr,
    HEAD_BLOCKS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    Q_LEN: tl.constexpr,
    LAT_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    pid = tl.program_id(0)
    m = tl.program_id(1)  # tile row: head g * q + query i
    b = pid // HEAD_BLOCKS
    g = m // Q_LEN
    i = m % Q_LEN
    h = (pid % HEAD_BLOCKS) * BLOCK_H + g
    if (g < BLOCK_H) & (h < HEADS):
        o_s = tl.arange(0, BLOCK_S)
        s_ok = o_s < num_splits
        o_r = tl.arange(0, BLOCK_R)
        r_ok = o_r < LAT_DIM
        part = pid.to(tl.int64) * num_splits + o_s
        b_lse = tl.load(lse_ptr + part * BLOCK_M + m, mask=s_ok, other=float("-inf"))
        b_po = tl.load(
            po_ptr + (part * BLOCK_M + m)[:, None] * LAT_DIM + o_r[None, :],
            mask=s_ok[:, None] & r_ok[None, :],
            other=0.0,
        )
        b_o = merge_splits(b_po, b_lse)
        p_o = o_ptr + b.to(tl.int64) * stride_ob + i * stride_ot + h * stride_oh + o_r * stride_or
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=r_ok)


def head_block(heads: int, q_len: int) -> int:
    """Heads per program: tile rows ``heads_per_block * q_len`` near ``TILES["rows"]`` (at least one head)."""
    return max(1, min(heads, TILES["rows"] // q_len))


def default_num_splits(
    device: torch.device, programs: int, rows: int, n_union: int, lat_dim: int, rot_dim: int
) -> int:
    """Splits per (row, head block), from shapes only: about ``TILES["programs_per_sm"]`` programs per SM, each on
    >= `MIN_SLOTS_PER_SPLIT` union slots, and float32 partials (``rows * R * 4`` bytes per split) no more than the
    union's latent bytes."""
    sms = multiprocessors(device) or 4  # 4 in the CPU interpreter: small enough that tests see several splits
    by_work = triton.cdiv(n_union, MIN_SLOTS_PER_SPLIT)
    by_grid = triton.cdiv(TILES["programs_per_sm"] * sms, programs)
    by_bytes = max(1, (n_union * (lat_dim + rot_dim) * 2) // (rows * lat_dim * 4))
    return max(1, min(by_work, by_grid, by_bytes, MAX_SPLITS))


@on_input_device
def sparse_mla_triton(
    q_lat: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, rot: torch.Tensor, slots: torch.Tensor,
    bits: torch.Tensor, count: torch.Tensor, scaling: float, num_splits: int | None = None, kv_share: int = 1,
) -> torch.Tensor:  # fmt: skip
    """Launch; shapes as `naive.sparse_mla_naive` with the selection merged (`naive.merged_selection`). Returns
    ``[B, q, H, R]`` in ``q_lat.dtype``. ``kv_share``: how many consecutive rows of ``q_lat`` (and of the selection)
    read one row of the cache: the per-query schedule runs a step of ``q`` queries as ``B * q`` one-query rows over
    the ``B`` cache rows (`naive.per_query_selection`)."""
    batch, q_len, heads, lat_dim = q_lat.shape
    rot_dim = q_rot.shape[-1]
    n_union = slots.shape[1]
    if n_union == 0:
        slots, bits = slots.new_zeros(batch, 1), bits.new_zeros(batch, 1)
    block_h = head_block(heads, q_len)
    head_blocks = triton.cdiv(heads, block_h)
    block_m = max(16, next_power_of_2(block_h * q_len))
    programs = batch * head_blocks
    splits = num_splits or default_num_splits(q_lat.device, programs, block_m, n_union, lat_dim, rot_dim)
    out = torch.empty(batch, q_len, heads, lat_dim, dtype=q_lat.dtype, device=q_lat.device)
    if splits > 1:
        partial = torch.empty(programs, splits, block_m, lat_dim, dtype=torch.float32, device=q_lat.device)
        lse = torch.empty(programs, splits, block_m, dtype=torch.float32, device=q_lat.device)
    else:
        partial, lse = out, out
    dot_f32, precision = dot_settings(q_lat.dtype)
    block_r = max(16, next_power_of_2(lat_dim))
    _sparse_mla_fwd[(programs, splits)](
        q_lat, q_rot, latent, rot, slots, bits, count, partial, lse,
        *q_lat.stride(), *q_rot.stride(), *latent.stride(), *rot.stride(), slots.stride(0), *out.stride(),
        scaling * 1.4426950408889634,  # log2(e): the kernel works in base 2
        n_union, splits,
        HEADS=heads, HEAD_BLOCKS=head_blocks, BLOCK_H=block_h, Q_LEN=q_len, KV_SHARE=kv_share, LAT_DIM=lat_dim,
        ROT_DIM=rot_dim,
        BLOCK_R=block_r, BLOCK_P=max(16, next_power_of_2(rot_dim)), BLOCK_M=block_m, BLOCK_N=TILES["block_n"],
        SINGLE_SPLIT=splits == 1, DOT_PRECISION=precision, DOT_F32=dot_f32,
        num_warps=TILES["num_warps"], num_stages=TILES["num_stages"], **pdl_launch(q_lat.device),
    )  # fmt: skip
    if splits > 1:
        _sparse_mla_merge[(programs, block_m)](
            partial, lse, out, *out.stride(), splits,
            HEADS=heads, HEAD_BLOCKS=head_blocks, BLOCK_H=block_h, Q_LEN=q_len, LAT_DIM=lat_dim, BLOCK_R=block_r,
            BLOCK_M=block_m, BLOCK_S=next_power_of_2(splits), num_warps=4, **pdl_launch(q_lat.device),
        )  # fmt: skip
    return out
