"""Token-sparse attention in Triton: gathered prefix slots + recent slots, split over programs.

One program per (row, KV head, split) serves every query head of that KV head and every query of the row
(``GROUP * q`` rows of one tile), so each gathered K/V row is read once per KV head. A row's work is the virtual
list ``[index[b, :count], recent_start, ..., start + q - 1]``; it is cut into ``num_splits`` equal parts at run
time (device-side lengths), each part reduced with an online softmax in float32. With more than one split a
second kernel merges the parts by their log-sum-exp. The grid depends on shapes only (``N``, batch, heads); the
split count is a run-time argument, so a growing ``N`` does not compile new kernel variants (only ``q``, the
head layout and the power-of-2 merge width do).
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

#: a split is worth launching for at least this many gathered slots
MIN_SLOTS_PER_SPLIT = 128
MAX_SPLITS = 64
#: launch settings of the forward kernel; ``benchmarks/sweep_token_sparse.py`` times the choices on the
#: long-context draft shapes. ``programs_per_sm``: how many programs per multiprocessor the default split count
#: aims for (``default_num_splits``). Measured on an H200 (eighth session, 8B heads, bf16, one new token, 7% of
#: the prefix selected, us per layer, 2 warps against 4): 1 x 16K 8.6 / 9.2, 4 x 32K 17.3 / 18.5, 4 x 64K
#: 30.8 / 31.8, 16 x 16K 29.9 / 30.4, 32 x 8K 28.7 / 29.1; 4 tokens at 4 x 64K 32.2 / 33.4. The best of 81
#: settings of block size, warps, stages and programs per SM at 4 x 64K (28.5 us) is 1.55x the gathered bytes'
#: copy time (18.4 us): each slot is a 256-byte row per KV head, read in index order.
TILES = {"block_n": 64, "num_warps": 2, "num_stages": 2, "programs_per_sm": 2}


@triton.jit
def _token_sparse_fwd(
    q_ptr,  # [B, H, q, D]
    k_ptr,  # [B, H_kv, C, D]
    v_ptr,  # [B, H_kv, C, D]
    index_ptr,  # [B, N]
    count_ptr,  # [B]
    recent_ptr,  # [B]
    start_ptr,  # [B]
    o_ptr,  # [B, q, H, D] (one split) or partial outputs [B * H_kv, S, GROUP * q, D] float32
    lse_ptr,  # [B * H_kv, S, GROUP * q] float32 (unused with one split)
    stride_qb,
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kc,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vc,
    stride_vd,
    stride_ib,
    stride_in,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    scale_log2,
    n_index,
    capacity,
    num_splits,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    Q_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = pid_bh // KV_HEADS
    h_kv = pid_bh % KV_HEADS

    count = tl.minimum(tl.maximum(tl.load(count_ptr + b).to(tl.int32), 0), n_index)
    recent = tl.maximum(tl.load(recent_ptr + b).to(tl.int32), 0)
    start = tl.load(start_ptr + b).to(tl.int32)
    n_recent = tl.maximum(tl.minimum(start + Q_LEN, capacity) - recent, 0)
    total = count + n_recent
    chunk = tl.cdiv(total, num_splits)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, total)

    o_m = tl.arange(0, BLOCK_M)  # tile row m = head g * q + query i
    m_ok = o_m < GROUP * Q_LEN
    g = o_m // Q_LEN
    i = o_m % Q_LEN
    o_d = tl.arange(0, BLOCK_D)
    d_ok = o_d < HEAD_DIM
    q_slot = start + i  # [BLOCK_M]

    p_q = (
        q_ptr
        + b.to(tl.int64) * stride_qb
        + (h_kv * GROUP + g)[:, None].to(tl.int64) * stride_qh
        + i[:, None] * stride_qt
        + o_d[None, :] * stride_qd
    )
    b_q = tl.load(p_q, mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    p_k = k_ptr + b.to(tl.int64) * stride_kb + h_kv.to(tl.int64) * stride_kh
    p_v = v_ptr + b.to(tl.int64) * stride_vb + h_kv.to(tl.int64) * stride_vh
    p_index = index_ptr + b.to(tl.int64) * stride_ib

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)  # positions in the virtual list
        n_ok = o_n < hi
        is_sel = o_n < count
        b_sel = tl.load(p_index + o_n * stride_in, mask=n_ok & is_sel, other=0).to(tl.int32)
        slot = tl.where(is_sel, b_sel, recent + o_n - count)
        slot = tl.where(n_ok, slot, 0).to(tl.int64)  # [BLOCK_N]
        kv_ok = n_ok[:, None] & d_ok[None, :]
        b_k = tl.load(p_k + slot[:, None] * stride_kc + o_d[None, :] * stride_kd, mask=kv_ok, other=0.0)
        b_v = tl.load(p_v + slot[:, None] * stride_vc + o_d[None, :] * stride_vd, mask=kv_ok, other=0.0)
        if DOT_F32:
            b_k = b_k.to(tl.float32)
            b_v = b_v.to(tl.float32)

        b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PRECISION) * scale_log2  # [BLOCK_M, BLOCK_N]
        attend = n_ok[None, :] & (is_sel[None, :] | (slot[None, :] <= q_slot[:, None]))
        b_s = tl.where(attend, b_s, float("-inf"))
        b_p, alpha, b_m, b_l = online_softmax_block(b_s, b_m, b_l)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=DOT_PRECISION)

    has = b_l > 0
    b_o = b_acc / tl.where(has, b_l, 1.0)[:, None]
    if SINGLE_SPLIT:
        p_o = (
            o_ptr
            + b.to(tl.int64) * stride_ob
            + i[:, None] * stride_ot
            + (h_kv * GROUP + g)[:, None] * stride_oh
            + o_d[None, :] * stride_od
        )
        tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    else:
        rows = GROUP * Q_LEN
        part = pid_bh.to(tl.int64) * num_splits + split
        p_o = o_ptr + (part * rows + o_m[:, None]) * HEAD_DIM + o_d[None, :]
        tl.store(p_o, b_o, mask=m_ok[:, None] & d_ok[None, :])
        b_lse = tl.where(has, b_m + tl.log2(tl.where(has, b_l, 1.0)), float("-inf"))
        tl.store(lse_ptr + part * rows + o_m, b_lse, mask=m_ok)


@triton.jit
def _token_sparse_merge(
    po_ptr,  # [B * H_kv, S, GROUP * q, D] float32
    lse_ptr,  # [B * H_kv, S, GROUP * q] float32
    o_ptr,  # [B, q, H, D]
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    num_splits,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    Q_LEN: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    pid_bh = tl.program_id(0)
    m = tl.program_id(1)  # tile row: head g * q + query i
    b = pid_bh // KV_HEADS
    h = (pid_bh % KV_HEADS) * GROUP + m // Q_LEN
    i = m % Q_LEN
    rows = GROUP * Q_LEN

    o_s = tl.arange(0, BLOCK_S)
    s_ok = o_s < num_splits
    o_d = tl.arange(0, BLOCK_D)
    d_ok = o_d < HEAD_DIM
    part = pid_bh.to(tl.int64) * num_splits + o_s  # [BLOCK_S]
    b_lse = tl.load(lse_ptr + part * rows + m, mask=s_ok, other=float("-inf"))
    b_po = tl.load(
        po_ptr + (part * rows + m)[:, None] * HEAD_DIM + o_d[None, :],
        mask=s_ok[:, None] & d_ok[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    b_o = merge_splits(b_po, b_lse)
    p_o = o_ptr + b.to(tl.int64) * stride_ob + i * stride_ot + h * stride_oh + o_d * stride_od
    tl.store(p_o, b_o.to(o_ptr.dtype.element_ty), mask=d_ok)


def default_num_splits(device: torch.device, batch_kv_heads: int, rows: int, n_index: int, q_len: int) -> int:
    """Splits per (row, KV head), from shapes only: about ``TILES["programs_per_sm"]`` programs per SM, each on
    >= 128 selected slots, and float32 partials (``splits * rows * D * 4`` bytes, written and read back) under ~20% of the gathered
    K/V bytes (``n_index * D * 2 * 2``), i.e. ``splits <= n_index / (10 * rows)``; ``rows = GROUP * q``."""
    sms = multiprocessors(device) or 4  # 4 in the CPU interpreter: small enough that tests see several splits
    by_work = triton.cdiv(n_index + q_len, MIN_SLOTS_PER_SPLIT)
    by_grid = triton.cdiv(TILES["programs_per_sm"] * sms, batch_kv_heads)
    by_bytes = n_index // (10 * rows)
    return max(1, min(by_work, by_grid, by_bytes, MAX_SPLITS))


@on_input_device
def token_sparse_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    index_count: torch.Tensor,
    recent_start: torch.Tensor,
    start: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Launch; shapes as `token_sparse_attention_naive`. Returns ``[B, q, H, D]`` in ``query.dtype``.

    ``num_splits`` (host int, default from shapes) cuts each row's slot list into that many programs.
    """
    batch, heads, q_len, dim = query.shape  # [B, H, q, D]
    kv_heads, capacity = key.shape[1], key.shape[2]  # [B, H_kv, C, D]
    group = heads // kv_heads
    n_index = index.shape[1]  # [B, N]
    if n_index == 0:
        index = index.new_zeros(batch, 1)
    rows = group * q_len
    splits = num_splits or default_num_splits(query.device, batch * kv_heads, rows, n_index, q_len)
    out = torch.empty(batch, q_len, heads, dim, dtype=query.dtype, device=query.device)  # [B, q, H, D]
    block_d = max(16, next_power_of_2(dim))
    block_m = max(16, next_power_of_2(rows))
    if splits > 1:
        partial = torch.empty(batch * kv_heads, splits, rows, dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(batch * kv_heads, splits, rows, dtype=torch.float32, device=query.device)
    else:
        partial, lse = out, out
    # Triton's CPU interpreter computes tl.dot on bfloat16 operands wrongly (seen with triton 3.9): upcast there
    dot_f32, precision = dot_settings(query.dtype)
    _token_sparse_fwd[(batch * kv_heads, splits)](
        query,
        key,
        value,
        index,
        index_count,
        recent_start,
        start,
        partial,
        lse,
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *index.stride(),
        *out.stride(),
        scale * 1.4426950408889634,  # log2(e): the kernel works in base 2
        n_index,
        capacity,
        splits,
        KV_HEADS=kv_heads,
        GROUP=group,
        Q_LEN=q_len,
        HEAD_DIM=dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=TILES["block_n"],
        SINGLE_SPLIT=splits == 1,
        DOT_PRECISION=precision,
        DOT_F32=dot_f32,
        num_warps=TILES["num_warps"],
        num_stages=TILES["num_stages"],
        **pdl_launch(query.device),
    )
    if splits > 1:
        _token_sparse_merge[(batch * kv_heads, rows)](
            partial,
            lse,
            out,
            *out.stride(),
            splits,
            KV_HEADS=kv_heads,
            GROUP=group,
            Q_LEN=q_len,
            HEAD_DIM=dim,
            BLOCK_D=block_d,
            BLOCK_S=next_power_of_2(splits),
            num_warps=4,
            **pdl_launch(partial.device),
        )
    return out
