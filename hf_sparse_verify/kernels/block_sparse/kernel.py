"""Triton block-sparse verify attention (shared index and exact merged schedule), split-K with a combine pass.

One program per (row, KV head, split) holds all ``GROUP * q`` query rows of that KV head (tile row
``r = g * q + i``: query head ``h * GROUP + g``, query ``i``). It walks a virtual schedule of
``1 + N_LOCAL + count`` entries: entry 0 is the sink block ``pad // BS``, entries ``1 .. N_LOCAL`` the local
blocks ``start // BS + j - 1`` (used while ``<= (start + q - 1) // BS``), then the ``count`` listed blocks. Every
block is used at most once: a local entry equal to the sink block is skipped (its loads masked off), and so is a
listed block that is the sink or a local block (forced blocks already cover every query). The schedule is cut into ``num_splits`` equal
chunks from the device-side count, so the grid depends only on shapes. Each used block's K and V tile is loaded
once and shared by all query rows; causal/padding (and, in the merged variant, per-query ``query_mask``) masks
are applied to the logits. Online softmax in float32 (base 2), partial results in a float32 workspace, then
`_combine` merges the splits and writes ``[B, q, H, D]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hf_sparse_verify.kernels._triton import (
    interpreting,
    multiprocessors,
    next_power_of_2,
    on_input_device,
    online_softmax_block,
    pdl_launch,
    pdl_wait,
)

LOG2E = 1.4426950408889634
_TL_DTYPE = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _block_sparse_split(
    q_ptr,  # [B, H, q, D]
    k_ptr,  # [B, H_kv, C, D]
    v_ptr,  # [B, H_kv, C, D]
    start_ptr,  # [B]
    pad_ptr,  # [B]
    idx_ptr,  # [B, H_kv, N]
    cnt_ptr,  # [B, H_kv]
    qmask_ptr,  # [B, H_kv, q, N] uint8 (unused without HAS_QMASK)
    o_acc_ptr,  # [B * H_kv, S, GROUP * q, D] float32
    o_m_ptr,  # [B * H_kv, S, GROUP * q] float32
    o_l_ptr,  # [B * H_kv, S, GROUP * q] float32
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_c,
    sk_d,
    sv_b,
    sv_h,
    sv_c,
    sv_d,
    si_b,
    si_h,
    si_n,
    sc_b,
    sc_h,
    sm_b,
    sm_h,
    sm_t,
    sm_n,
    H_KV,
    C,
    N,
    D,
    qk_scale,
    Q_LEN: tl.constexpr,
    GROUP: tl.constexpr,
    BS: tl.constexpr,
    N_LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_QMASK: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    b = pid_bh // H_KV
    h = pid_bh % H_KV

    start = tl.load(start_ptr + b).to(tl.int64)
    pad = tl.load(pad_ptr + b).to(tl.int64)
    count = tl.load(cnt_ptr + b * sc_b + h * sc_h).to(tl.int64)
    count = tl.minimum(tl.maximum(count, 0), N)
    sink = pad // BS
    local_lo = start // BS
    local_hi = (start + Q_LEN - 1) // BS
    n_forced = 1 + N_LOCAL
    total = n_forced + count
    chunk = tl.cdiv(total, num_splits)
    j_lo = split * chunk
    j_hi = tl.minimum(j_lo + chunk, total)

    rows = tl.arange(0, BLOCK_M)
    g = rows // Q_LEN
    i = rows % Q_LEN
    row_ok = rows < GROUP * Q_LEN
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_s = tl.arange(0, BS)

    p_q = q_ptr + b * sq_b + (h * GROUP + g)[:, None] * sq_h + i[:, None] * sq_t + offs_d[None, :] * sq_d
    b_q = tl.load(p_q, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(DOT_DTYPE)  # [BLOCK_M, BLOCK_D]
    q_pos = start + i  # [BLOCK_M]
    p_k = k_ptr + b * sk_b + h * sk_h
    p_v = v_ptr + b * sv_b + h * sv_h
    p_idx = idx_ptr + b * si_b + h * si_h
    p_qmask = qmask_ptr + b * sm_b + h * sm_h + i * sm_t  # [BLOCK_M]

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    for j in range(j_lo, j_hi):
        n = j - n_forced
        listed = n >= 0
        n_safe = tl.maximum(n, 0)
        b_listed = tl.load(p_idx + n_safe * si_n, mask=listed, other=0).to(tl.int64)
        blk = tl.where(j == 0, sink, tl.where(listed, b_listed, local_lo + j - 1))
        is_local = (blk >= local_lo) & (blk <= local_hi)
        # sink always; a local entry while in range and not the sink; a listed block when not forced. An unused
        # entry is masked out (no memory traffic) rather than branched around, so the loads can be pipelined.
        use = (j == 0) | ((blk != sink) & (is_local != listed))
        slots = blk * BS + offs_s  # [BS]
        kv_ok = (slots >= 0) & (slots < C) & use
        b_kt = tl.load(
            p_k + slots[None, :] * sk_c + offs_d[:, None] * sk_d,
            mask=kv_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(DOT_DTYPE)  # [BLOCK_D, BS]
        b_v = tl.load(
            p_v + slots[:, None] * sv_c + offs_d[None, :] * sv_d,
            mask=kv_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(DOT_DTYPE)  # [BS, BLOCK_D]
        b_s = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BS]
        allowed = (slots[None, :] <= q_pos[:, None]) & (slots[None, :] >= pad) & kv_ok[None, :]
        if HAS_QMASK:
            b_sel = tl.load(p_qmask + n_safe * sm_n, mask=row_ok, other=1)  # [BLOCK_M]
            allowed = allowed & tl.where(listed, b_sel != 0, True)[:, None]
        b_s = tl.where(allowed, b_s, float("-inf"))
        b_p, alpha, b_m, b_l = online_softmax_block(b_s, b_m, b_l)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(DOT_DTYPE), b_v, input_precision=DOT_PRECISION)

    rows_total = GROUP * Q_LEN
    base = pid_bh * num_splits + split
    tl.store(o_m_ptr + base * rows_total + rows, b_m, mask=row_ok)
    tl.store(o_l_ptr + base * rows_total + rows, b_l, mask=row_ok)
    p_acc = o_acc_ptr + (base * rows_total + rows)[:, None] * D + offs_d[None, :]
    tl.store(p_acc, b_acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine(
    acc_ptr,  # [B * H_kv, S, GROUP * q, D] float32
    m_ptr,  # [B * H_kv, S, GROUP * q] float32
    l_ptr,  # [B * H_kv, S, GROUP * q] float32
    o_ptr,  # [B, q, H, D]
    so_b,
    so_t,
    so_h,
    so_d,
    H_KV,
    D,
    NUM_SPLITS,
    Q_LEN: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    # one program per (row and KV head, query head of the group, token): every split's partial in one load
    pdl_wait(PDL)
    pid_bh = tl.program_id(0)
    g = tl.program_id(1)
    i = tl.program_id(2)
    b = pid_bh // H_KV
    h = pid_bh % H_KV
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    base = (pid_bh * NUM_SPLITS + offs_s) * (GROUP * Q_LEN) + g * Q_LEN + i  # [BLOCK_S]
    m_s = tl.load(m_ptr + base, mask=s_ok, other=float("-inf"))
    l_s = tl.load(l_ptr + base, mask=s_ok, other=0.0)
    b_acc = tl.load(
        acc_ptr + base[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0
    )
    m = tl.max(m_s, axis=0)
    w = tl.exp2(m_s - tl.where(m == float("-inf"), 0.0, m))  # 0 for splits that saw no slot
    b_l = tl.sum(l_s * w, axis=0)
    b_out = tl.sum(b_acc * w[:, None], axis=0) / tl.where(b_l > 0, b_l, 1.0)
    p_o = o_ptr + b * so_b + i * so_t + (h * GROUP + g) * so_h + offs_d * so_d
    tl.store(p_o, b_out.to(o_ptr.dtype.element_ty), mask=d_ok)


def local_block_slots(q_len: int, block_size: int) -> int:
    """Most blocks that ``q_len`` consecutive slots can touch (the local entries of the schedule)."""
    return (q_len + block_size - 2) // block_size + 1


#: `default_num_splits`: programs per multiprocessor aimed at, and the fewest schedule entries per split
SPLIT_WAVES = 2
SPLIT_MIN_ENTRIES = 2


def default_num_splits(batch: int, kv_heads: int, entries: int, device: torch.device) -> int:
    """Splits per (row, KV head): about `SPLIT_WAVES` waves of programs, at least `SPLIT_MIN_ENTRIES` schedule
    entries per split."""
    wave = -(-(multiprocessors(device) or 4) * SPLIT_WAVES // (batch * kv_heads))
    return max(1, min(wave, -(-entries // SPLIT_MIN_ENTRIES)))


@on_input_device
def block_sparse_attention_triton(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    scale: float,
    query_mask: torch.Tensor | None = None,
    num_splits: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launch the split kernel and the combine kernel; returns ``[B, q, H, D]`` in ``query.dtype``.

    Inputs as in `block_sparse_attention_naive`; ``num_splits`` 0 picks `default_num_splits`; ``out`` an
    optional ``[B, q, H, D]`` buffer to write. No host syncs: the grid depends only on shapes.
    """
    b, h, q_len, d = query.shape  # [B, H, q, D]
    h_kv, capacity = key.shape[1], key.shape[2]  # [B, H_kv, C, D]
    n = block_index.shape[-1]  # [B, H_kv, N]
    group = h // h_kv
    n_local = local_block_slots(q_len, block_size)
    if num_splits <= 0:
        num_splits = default_num_splits(b, h_kv, 1 + n_local + n, query.device)
    rows = group * q_len
    block_m = max(16, next_power_of_2(rows))
    block_d = max(16, next_power_of_2(d))

    dev = query.device
    acc = torch.empty(b * h_kv, num_splits, rows, d, device=dev, dtype=torch.float32)
    m = torch.empty(b * h_kv, num_splits, rows, device=dev, dtype=torch.float32)
    l_sum = torch.empty_like(m)
    if out is None:
        out = torch.empty(b, q_len, h, d, device=dev, dtype=query.dtype)  # [B, q, H, D]

    has_qmask = query_mask is not None and n > 0  # with N == 0 there is no listed entry to mask
    if has_qmask:
        qmask = query_mask.view(torch.uint8) if query_mask.dtype == torch.bool else query_mask
        qmask_strides = qmask.stride()
    else:
        qmask = block_index  # never read
        qmask_strides = (0, 0, 0, 0)
    # the interpreter's bf16 dot is wrong (triton 3.9): upcast there
    dot_dtype = _TL_DTYPE[torch.float32 if interpreting() and query.dtype == torch.bfloat16 else query.dtype]
    precision = "ieee" if dot_dtype == tl.float32 else "tf32"

    _block_sparse_split[(b * h_kv, num_splits)](
        query, key, value, start, pad, block_index, block_count, qmask,
        acc, m, l_sum,
        *query.stride(), *key.stride(), *value.stride(), *block_index.stride(), *block_count.stride(),
        *qmask_strides,
        h_kv, capacity, n, d,
        scale * LOG2E,
        Q_LEN=q_len, GROUP=group, BS=block_size, N_LOCAL=n_local, BLOCK_M=block_m, BLOCK_D=block_d,
        HAS_QMASK=has_qmask, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision,
        num_warps=4 if block_m * block_size <= 64 * 64 else 8,
        **pdl_launch(query.device),
    )  # fmt: skip
    _combine[(b * h_kv, group, q_len)](
        acc, m, l_sum, out,
        *out.stride(),
        h_kv, d, num_splits,
        Q_LEN=q_len, GROUP=group, BLOCK_S=max(2, next_power_of_2(num_splits)), BLOCK_D=block_d,
        **pdl_launch(acc.device),
    )  # fmt: skip
    return out
