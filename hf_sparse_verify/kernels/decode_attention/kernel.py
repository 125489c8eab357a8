"""Triton split-KV decode attention for ``q`` = 1..16 new tokens per row (decode and verify steps).

Grid ``(splits, H_kv, B)``: each program reads one contiguous share of one row's valid slots for one KV head and
processes all ``group * q`` query rows of that KV head at once (GQA packing: every K/V row is loaded once per
KV head). The share is computed on the device from ``start``/``pad``, so the grid depends on shapes only and the
launch can be captured in a CUDA graph. A second kernel merges the splits' partial softmax states.

Optionally (``COLLECT``) the split kernel also writes, per KV head, the raw logits ``q . k * scale`` summed over the
group's heads and the chosen query rows: the Vegas "Collect-2-Query" signal, at the cost of one float32 store per
slot and KV head (0.4% of the K/V bytes at head_dim 128). Measured on an H200 (8B shape,
64K): +3.8-5.0% of a verify step of 1-8 tokens, +8.4% at 16; an elementwise mat-vec of the K tile with the summed
queries measured slower (+12-20%).

With ``WEIGHTS`` the signal is the softmax weight ``exp(logit - lse)`` instead (heads become comparable). The
row's log-sum-exp is known only after the merge, so the split kernel stores the scored rows' raw logits
(``group x 2`` float32 per slot and KV head for first-and-last rows: 8 at the 8B shape, 6% of the K/V bytes),
the merge kernel stores each row's log-sum-exp, and `_weights_kernel` reads the logits once more to sum the
weights. No second pass over the keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _soft_cap(x, cap):
    """``cap * tanh(x / cap)``, with tanh from one exponential of a non-positive argument (no overflow)."""
    e = tl.exp(-2.0 * tl.abs(x / cap))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0, -t, t)


@triton.jit
def _first_read(start, pad, window):
    """The first slot a row's split programs read: past the padding and the window; queries inside the padding
    still read their own slot."""
    lo = pad
    if window > 0:
        lo = tl.maximum(lo, start - window + 1)
    return tl.minimum(lo, start)


@triton.jit
def _split_kernel(
    Q, K, V, START, PAD,
    O_PART, M_PART, L_PART, S_PART, LSE_IN,
    scale, score_scale, softcap, window, q_len, group, num_splits, capacity, rows_per_group,
    s_qb, s_qh, s_qt, s_qd,
    s_kb, s_kh, s_kt, s_kd,
    s_vb, s_vh, s_vt, s_vd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    COLLECT: tl.constexpr, WEIGHTS: tl.constexpr, SCORE_DOT: tl.constexpr, ROW_DOT: tl.constexpr,
    CARRIED: tl.constexpr, CARRIED_DOT: tl.constexpr,
    IEEE: tl.constexpr, DOT_F32: tl.constexpr, SOFTCAP: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kv_heads = tl.num_programs(1)

    start = tl.load(START + b)
    pad = tl.load(PAD + b)
    lo = _first_read(start, pad, window)
    hi = start + q_len
    share = tl.cdiv(tl.cdiv(hi - lo, num_splits), BLOCK_N) * BLOCK_N
    s_lo = lo + split * share
    s_hi = tl.minimum(s_lo + share, hi)

    offs_m = tl.arange(0, BLOCK_M)
    row_ok = offs_m < group * q_len
    g = offs_m // q_len  # query head within the group
    i = offs_m % q_len  # new token
    own = start + i  # [BLOCK_M] each row's own slot
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    p_q = Q + b * s_qb + (kvh * group + g)[:, None] * s_qh + i[:, None] * s_qt + offs_d[None, :] * s_qd
    b_q = tl.load(p_q, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    if COLLECT == 1:
        scored = row_ok & ((i == 0) | (i == q_len - 1))
        r_idx = g * rows_per_group + (i != 0).to(tl.int32)  # WEIGHTS: the row's place among the scored rows
    else:
        scored = row_ok
        r_idx = offs_m
    if ROW_DOT:
        # the scored rows' own queries (first and last row of each head of the group) in a 16-row tile: their
        # logits come from one small extra dot per key tile, stored from 16 rows instead of the BLOCK_M-row
        # logits tile (a store from the large tile cost +47% of a 5-token verify step at 16 x 16K)
        r16 = tl.arange(0, 16)
        n_scored = group * rows_per_group
        g_r = r16 // rows_per_group
        i_r = (r16 % rows_per_group) * (q_len - 1)
        r_ok = r16 < n_scored
        p_qr = (
            Q + b * s_qb + (kvh * group + g_r)[:, None] * s_qh + i_r[:, None] * s_qt + offs_d[None, :] * s_qd
        )
        b_qr = tl.load(p_qr, mask=r_ok[:, None] & d_ok[None, :], other=0.0)  # [16, BLOCK_D]
        if DOT_F32:
            b_qr = b_qr.to(tl.float32)
    if SCORE_DOT:
        # many query rows: one extra 16-row dot whose first row is the sum of the scored queries (so the per-tile
        # reduction runs over 16 rows, not BLOCK_M)
        b_qsum = tl.sum(tl.where(scored[:, None], b_q.to(tl.float32), 0.0), axis=0)  # [BLOCK_D]
        r16 = tl.arange(0, 16)
        b_qs = tl.where(r16[:, None] == 0, b_qsum[None, :], 0.0).to(b_q.dtype)  # [16, BLOCK_D]

    if CARRIED:  # each scored row's head's carried log-sum-exp (LSE_IN [B, H])
        lse_in = tl.load(LSE_IN + b * (kv_heads * group) + kvh * group + g, mask=scored, other=0.0)

    b_m = tl.full([BLOCK_M], NEG_INF, tl.float32)
    b_l = tl.zeros([BLOCK_M], tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = K + b * s_kb + kvh * s_kh
    v_base = V + b * s_vb + kvh * s_vh
    for n0 in range(s_lo, s_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < s_hi
        kv_mask = n_ok[:, None] & d_ok[None, :]
        b_k = tl.load(k_base + offs_n[:, None] * s_kt + offs_d[None, :] * s_kd, mask=kv_mask, other=0.0)
        if DOT_F32:
            b_k = b_k.to(tl.float32)
        if IEEE:
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK_N]
        else:
            b_s = tl.dot(b_q, tl.trans(b_k)) * scale
        if SOFTCAP:
            b_s = _soft_cap(b_s, softcap)
        if ROW_DOT:
            if IEEE:
                b_sr = tl.dot(b_qr, tl.trans(b_k), input_precision="ieee") * scale  # [16, BLOCK_N]
            else:
                b_sr = tl.dot(b_qr, tl.trans(b_k)) * scale
            if SOFTCAP:
                b_sr = _soft_cap(b_sr, softcap)
            p_s = S_PART + ((b * kv_heads + kvh) * n_scored + r16[:, None]) * capacity + offs_n[None, :]
            tl.store(p_s, b_sr, mask=r_ok[:, None] & n_ok[None, :])
        elif WEIGHTS:
            # the scored rows' raw logits; the merge gives their log-sum-exp and `_weights_kernel` normalises
            n_rows = group * rows_per_group
            p_s = S_PART + ((b * kv_heads + kvh) * n_rows + r_idx[:, None]) * capacity + offs_n[None, :]
            tl.store(p_s, b_s, mask=scored[:, None] & n_ok[None, :])
        elif SCORE_DOT:
            if IEEE:
                b_col = tl.sum(tl.dot(b_qs, tl.trans(b_k), input_precision="ieee"), axis=0) * scale
            else:
                b_col = tl.sum(tl.dot(b_qs, tl.trans(b_k)), axis=0) * scale  # [BLOCK_N]
            b_col = b_col * score_scale
            tl.store(S_PART + (b * kv_heads + kvh) * capacity + offs_n, b_col, mask=n_ok)
        elif COLLECT > 0 and not CARRIED:
            b_col = tl.sum(tl.where(scored[:, None], b_s, 0.0), axis=0) * score_scale  # [BLOCK_N]
            tl.store(S_PART + (b * kv_heads + kvh) * capacity + offs_n, b_col, mask=n_ok)
        allowed = (offs_n[None, :] <= own[:, None]) & (offs_n[None, :] >= pad)
        if window > 0:
            allowed = allowed & (offs_n[None, :] > own[:, None] - window)
        allowed = (allowed | (offs_n[None, :] == own[:, None])) & n_ok[None, :]
        b_s = tl.where(allowed, b_s, NEG_INF)
        m_new = tl.maximum(b_m, tl.max(b_s, 1))
        m_safe = tl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = tl.exp(b_m - m_safe)
        b_p = tl.exp(b_s - m_safe[:, None])
        b_l = b_l * alpha + tl.sum(b_p, 1)
        if CARRIED:
            # softmax weights against the carried log-sum-exp, from the softmax's own exponentials:
            # exp(s - lse_in) = p * exp(m - lse_in) (the exponent capped so a disallowed slot's p = 0 stays 0)
            b_c = tl.where(scored, tl.exp(tl.minimum(m_safe - lse_in, 80.0)), 0.0)  # [BLOCK_M]
            if CARRIED_DOT:  # the row sum as a 16-row dot whose first row is b_c (no cross-warp reduction)
                r16 = tl.arange(0, 16)
                b_c16 = tl.where(r16[:, None] == 0, b_c[None, :], 0.0)  # [16, BLOCK_M]
                if IEEE:
                    b_w16 = tl.dot(b_c16, b_p, input_precision="ieee")
                elif DOT_F32:
                    b_w16 = tl.dot(b_c16, b_p)
                else:
                    b_w16 = tl.dot(b_c16.to(V.dtype.element_ty), b_p.to(V.dtype.element_ty))
                b_col = tl.sum(b_w16, axis=0) * score_scale  # [BLOCK_N]
            else:
                b_col = tl.sum(b_p * b_c[:, None], axis=0) * score_scale  # [BLOCK_N]
            tl.store(S_PART + (b * kv_heads + kvh) * capacity + offs_n, b_col, mask=n_ok)
        b_v = tl.load(v_base + offs_n[:, None] * s_vt + offs_d[None, :] * s_vd, mask=kv_mask, other=0.0)
        if DOT_F32:
            b_v = b_v.to(tl.float32)
        if IEEE:
            b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision="ieee")
        else:
            b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        b_m = m_new

    part = (b * kv_heads + kvh) * num_splits + split
    tl.store(M_PART + part * BLOCK_M + offs_m, b_m)
    tl.store(L_PART + part * BLOCK_M + offs_m, b_l)
    tl.store(O_PART + (part * BLOCK_M + offs_m[:, None]) * BLOCK_D + offs_d[None, :], b_acc)


@triton.jit
def _merge_kernel(
    O_PART, M_PART, L_PART, OUT, LSE, SINKS,
    q_len, group, num_splits,
    s_ob, s_ot, s_oh, s_od,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
    STORE_LSE: tl.constexpr, CARRY_LSE: tl.constexpr, HAS_SINKS: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    # one program per (query row, KV head, batch row): all splits of that row at once
    m = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kv_heads = tl.num_programs(1)
    g = m // q_len
    i = m % q_len
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    rows = ((b * kv_heads + kvh) * num_splits + offs_s) * BLOCK_M + m  # [BLOCK_S]
    m_s = tl.load(M_PART + rows, mask=s_ok, other=NEG_INF)
    l_s = tl.load(L_PART + rows, mask=s_ok, other=0.0)
    o_s = tl.load(O_PART + rows[:, None] * BLOCK_D + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    m_max = tl.max(m_s, 0)
    if HAS_SINKS:  # the head's sink logit joins the denominator (and the running max) and attends to nothing
        sink = tl.load(SINKS + kvh * group + g).to(tl.float32)
        m_max = tl.maximum(m_max, sink)
    w = tl.exp(m_s - tl.where(m_max == NEG_INF, 0.0, m_max))  # splits without slots weigh 0
    b_l = tl.sum(w * l_s, 0)  # the cached slots' share of the denominator
    b_den = b_l
    if HAS_SINKS:
        b_den = b_l + tl.exp(sink - m_max)
    b_out = tl.sum(w[:, None] * o_s, 0) / tl.where(b_den > 0, b_den, 1.0)  # [BLOCK_D]
    p_o = OUT + b * s_ob + i * s_ot + (kvh * group + g) * s_oh + offs_d * s_od
    tl.store(p_o, b_out.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)
    if STORE_LSE:  # the cached slots' log-sum-exp (score weights are their softmax alone, as the reference's)
        tl.store(LSE + (b * kv_heads + kvh) * (group * q_len) + m, m_max + tl.log(b_l))
    # the first row's log-sum-exp per query head: the next verify step's normaliser (LSE [B, H])
    if CARRY_LSE:
        if i == 0:
            tl.store(LSE + b * (kv_heads * group) + kvh * group + g, m_max + tl.log(b_l))


@triton.jit
def _head_weights(
    S_ROWS, LSE, b, kvh, kv_heads, start, pad, offs_n, n_ok, offs_r, window, q_len, group, rows_per_group, capacity,
    COLLECT: tl.constexpr,
):  # fmt: skip
    # softmax weights of one KV head's scored rows on the slots `offs_n`, summed over the rows: [BLOCK_N]
    n_rows = group * rows_per_group
    r_ok = offs_r < n_rows
    g = offs_r // rows_per_group
    if COLLECT == 1:
        i = (offs_r % rows_per_group) * (q_len - 1)  # first row, then the last
    else:
        i = offs_r % rows_per_group
    lse = tl.load(LSE + (b * kv_heads + kvh) * (group * q_len) + g * q_len + i, mask=r_ok, other=0.0)
    own = start + i
    valid = (offs_n[None, :] >= pad) & (offs_n[None, :] <= own[:, None])
    if window > 0:
        valid = valid & (offs_n[None, :] > own[:, None] - window)
    valid = (valid | (offs_n[None, :] == own[:, None])) & r_ok[:, None] & n_ok[None, :]
    # only slots a split wrote are valid: the others are never loaded
    p_s = S_ROWS + ((b * kv_heads + kvh) * n_rows + offs_r[:, None]) * capacity + offs_n[None, :]
    b_s = tl.load(p_s, mask=valid, other=NEG_INF)  # [BLOCK_R, BLOCK_N]
    b_w = tl.exp(b_s - tl.where(valid, lse[:, None], 0.0))
    return tl.sum(b_w, 0)


@triton.jit
def _weights_kernel(
    S_ROWS, LSE, START, PAD, OUT,
    score_scale, window, q_len, group, rows_per_group, capacity, kv_heads,
    COLLECT: tl.constexpr, MEAN_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    # one program per (slot tile, KV head or all of them with MEAN_HEADS, batch row): softmax weights of the scored
    # rows, summed over them (and averaged over the KV heads with MEAN_HEADS)
    nb = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    start = tl.load(START + b)
    pad = tl.load(PAD + b)
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < capacity
    if MEAN_HEADS:
        b_sum = tl.zeros([BLOCK_N], tl.float32)
        for kvh in tl.static_range(KV_HEADS):  # unrolled: the heads' loads are in flight together
            b_sum += _head_weights(
                S_ROWS, LSE, b, kvh, kv_heads, start, pad, offs_n, n_ok, offs_r, window, q_len, group,
                rows_per_group, capacity, COLLECT,
            )  # fmt: skip
        tl.store(OUT + b * capacity + offs_n, b_sum * (score_scale / kv_heads), mask=n_ok)
    else:
        kvh = tl.program_id(1)
        b_w = _head_weights(
            S_ROWS, LSE, b, kvh, kv_heads, start, pad, offs_n, n_ok, offs_r, window, q_len, group, rows_per_group,
            capacity, COLLECT,
        )  # fmt: skip
        tl.store(OUT + (b * kv_heads + kvh) * capacity + offs_n, b_w * score_scale, mask=n_ok)


@triton.jit
def _head_mean_kernel(
    S_HEADS, START, PAD, OUT,
    window, q_len, capacity,
    KV_HEADS: tl.constexpr, BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    # one program per (slot tile, batch row): the mean over the KV heads of the per-KV-head scores the split kernel
    # summed (carried log-sum-exp), 0 outside the slots the splits read
    nb = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    start = tl.load(START + b)
    lo = _first_read(start, tl.load(PAD + b), window)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    read = (offs_n >= lo) & (offs_n < start + q_len)
    b_sum = tl.zeros([BLOCK_N], tl.float32)
    for kvh in tl.static_range(KV_HEADS):
        b_sum += tl.load(S_HEADS + (b * KV_HEADS + kvh) * capacity + offs_n, mask=read, other=0.0)
    tl.store(OUT + b * capacity + offs_n, b_sum / KV_HEADS, mask=offs_n < capacity)


#: tile settings; benchmarks sweep them (``bench.py``), the engine uses the defaults
TILES = {"block_n": 64, "num_stages": 3}
#: overrides of `TILES` (and of the warp count, 4 below 128 rows, 8 at 128) by the split kernel's query rows
#: ``BLOCK_M`` (GQA group x new tokens, padded to a power of two): verify steps hold 32..128 rows, decode steps 16.
#: ``benchmarks/sweep_decode_attention.py`` times the choices on the long-context shapes.
TILES_BY_ROWS: dict[int, dict] = {}


#: overrides of the split kernel's tiles by ``BLOCK_M`` when it also writes Vegas' softmax-weight score rows.
#: Measured on an H200 (fifth session, 8B heads, bf16, us per layer, default splits): at 32 rows (5-8 new tokens) two
#: pipeline stages instead of three, 7-token verify at 4 x 64K 361 against 427 (no scores: 294), at 16 x 16K 366
#: against 376; 5 tokens 354 / 421 and 359 / 373. At 64 rows (9 tokens) two stages were slower end to end (a 9-token
#: verify at 4 x 64K: 22.76 against 19.00 ms per step), so only 32 rows.
TILES_WITH_WEIGHTS: dict[int, dict] = {32: {"num_stages": 2}}


def split_tiles(block_m: int, weights: bool = False) -> dict:
    """``block_n``, ``num_stages`` and ``num_warps`` of the split kernel for ``block_m`` query rows (``weights``:
    when it also writes softmax-weight score rows)."""
    tiles = {"num_warps": 8 if block_m >= 128 else 4, **TILES, **TILES_BY_ROWS.get(block_m, {})}
    return {**tiles, **TILES_WITH_WEIGHTS.get(block_m, {})} if weights else tiles


#: softmax-weight scores of first and last rows (``group x 2 <= 16``) from a 16-row dot of those rows' queries
#: when the step has more than 16 query rows (False: store them from the step's logits tile)
WEIGHT_ROW_DOT = True
#: score collection for 17..32 query rows through a 16-row dot (False: reduce the logits tile's rows). Measured on
#: an H200 (8B heads, 64K): 87 vs 96 us at 8 new tokens (32 rows); at 16 (64 rows) the row reduction is faster.
SCORE_DOT_ROWS = True
#: carried-lse weights: the sum over scored rows as a 16-row dot (False: a reduction over the logits tile's rows)
#: and the split kernel's tiles as with stored logits (`TILES_WITH_WEIGHTS`: two stages at 32 rows). Measured on an
#: H200 (16th session, 8B heads, bf16, 7-token verify at 4 x 64K, us per layer, `benchmarks/diag_vegas_lse.py`):
#: dot + two stages 341, row reduction + two stages 520, dot / row reduction with three stages 466 / 417; stored
#: logits (lse "step") 364, no scores 298.
CARRIED_DOT = True
CARRIED_WEIGHT_TILES = True
#: `_weights_kernel`: slots per program (at most; fewer when ``scored rows x slots`` would pass 4096) and warps.
#: Measured on an H200 (nineteenth session, `benchmarks/sweep_vegas_weights.py`, 7-token verify with scores, the
#: whole op, us per layer): 64 slots on one warp 373.5 / 376.1 at 4 x 64K / 16 x 16K against 382.7 / 383.3 for the
#: previous 256 slots on four warps (no scores: 314.3 / 317.3); Nsight Compute had the previous setting at 33% of
#: DRAM bandwidth, limited to 25% occupancy by 111 registers per thread.
WEIGHTS_TILES = {"block_n": 64, "num_warps": 1}
#: slots per program of `_head_mean_kernel`
HEAD_MEAN_BLOCK = 256


@on_input_device
def launch(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    scale: float,
    window: int,
    collect: int,
    num_splits: int,
    weights: bool = False,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    mean_heads: bool = False,
    carried_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the kernels. ``collect``: 0 none, 1 first and last row, 2 all rows; returns (``[B, q, H, D]``,
    per-KV-head scores ``[B, H_kv, C]`` float32: the mean over the KV head's query heads and the scored rows of
    the raw logits, or of the softmax weights with ``weights``; or None). With ``weights`` and ``mean_heads`` the
    weights kernel also averages over the KV heads: scores ``[B, C]``.

    ``carried_lse`` ``[B, H]`` float32 (with ``weights``): normalise the weights by it instead of each row's own
    log-sum-exp, summed per KV head inside the split kernel (no stored logits, no weights pass; `_head_mean_kernel`
    averages the KV heads with ``mean_heads``); the merge then overwrites it with the first query row's
    log-sum-exp."""
    batch, heads, q_len, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    group = heads // kv_heads
    block_m = max(16, next_power_of_2(group * q_len))
    block_d = max(16, next_power_of_2(dim))
    weights = bool(collect) and weights
    mean_heads = weights and mean_heads
    carried = weights and carried_lse is not None  # weights summed in the split kernel (`CARRIED`)
    tiles = split_tiles(block_m, weights and (CARRIED_WEIGHT_TILES or not carried))
    block_n = tiles["block_n"] if block_d <= 128 else 32
    device = query.device
    o_part = torch.empty(batch, kv_heads, num_splits, block_m, block_d, device=device, dtype=torch.float32)
    m_part = torch.empty(batch, kv_heads, num_splits, block_m, device=device, dtype=torch.float32)
    l_part = torch.empty_like(m_part)
    rows_per_group = (2 if q_len > 1 else 1) if collect == 1 else q_len
    score_scale = 1.0 / (group * rows_per_group)
    if carried:  # per-KV-head weight sums; the head-mean kernel reads only the slots the splits wrote
        alloc = torch.empty if mean_heads else torch.zeros
        s_part = alloc(batch, kv_heads, capacity, device=device, dtype=torch.float32)
        lse = carried_lse
    elif weights:  # raw logits of every scored row, normalised after the merge
        s_part = torch.empty(
            batch, kv_heads, group * rows_per_group, capacity, device=device, dtype=torch.float32
        )
        lse = torch.empty(batch, kv_heads, group * q_len, device=device, dtype=torch.float32)
    elif collect:
        s_part = torch.zeros(batch, kv_heads, capacity, device=device, dtype=torch.float32)
        lse = m_part
    else:
        s_part = lse = m_part
    out = torch.empty(batch, q_len, heads, dim, device=device, dtype=query.dtype)
    # the summed-query dot sums logits before any cap: only for plain logits
    score_dot = not weights and not softcap and bool(collect) and block_m == 32 and SCORE_DOT_ROWS
    stored = weights and not carried  # the scored rows' logits go to s_part, normalised by `_weights_kernel`
    row_dot = stored and collect == 1 and block_m > 16 and group * rows_per_group <= 16 and WEIGHT_ROW_DOT
    _split_kernel[(num_splits, kv_heads, batch)](
        query, key, value, start, pad,
        o_part, m_part, l_part, s_part, lse,
        scale, score_scale, float(softcap), window, q_len, group, num_splits, capacity, rows_per_group,
        *query.stride(), *key.stride(), *value.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, HEAD_DIM=dim,
        COLLECT=collect, WEIGHTS=stored, SCORE_DOT=score_dot, ROW_DOT=row_dot, CARRIED=carried,
        CARRIED_DOT=CARRIED_DOT,
        IEEE=query.dtype == torch.float32, DOT_F32=dot_in_float32(query.dtype), SOFTCAP=bool(softcap),
        num_warps=tiles["num_warps"], num_stages=tiles["num_stages"],
        **pdl_launch(query.device),
    )  # fmt: skip
    sink_logits = (
        sinks if sinks is not None else m_part
    )  # [H], read in its own dtype; m_part: an unread placeholder
    _merge_kernel[(group * q_len, kv_heads, batch)](
        o_part, m_part, l_part, out, lse, sink_logits,
        q_len, group, num_splits,
        *out.stride(),
        BLOCK_M=block_m, BLOCK_S=next_power_of_2(num_splits), BLOCK_D=block_d, HEAD_DIM=dim,
        STORE_LSE=stored, CARRY_LSE=carried, HAS_SINKS=sinks is not None, num_warps=4,
        **pdl_launch(o_part.device),
    )  # fmt: skip
    if not collect:
        return out, None
    if not weights or (carried and not mean_heads):
        return out, s_part
    if carried:
        scores = torch.empty(batch, capacity, device=device, dtype=torch.float32)
        _head_mean_kernel[(triton.cdiv(capacity, HEAD_MEAN_BLOCK), batch)](
            s_part, start, pad, scores,
            window, q_len, capacity,
            KV_HEADS=kv_heads, BLOCK_N=HEAD_MEAN_BLOCK, num_warps=4,
            **pdl_launch(s_part.device),
        )  # fmt: skip
        return out, scores
    shape = (batch, capacity) if mean_heads else (batch, kv_heads, capacity)
    scores = torch.empty(shape, device=device, dtype=torch.float32)
    block_r = max(2, next_power_of_2(group * rows_per_group))
    block_n_w = max(16, min(WEIGHTS_TILES["block_n"], 4096 // block_r))
    _weights_kernel[(triton.cdiv(capacity, block_n_w), 1 if mean_heads else kv_heads, batch)](
        s_part, lse, start, pad, scores,
        score_scale, window, q_len, group, rows_per_group, capacity, kv_heads,
        COLLECT=collect, MEAN_HEADS=mean_heads, KV_HEADS=kv_heads if mean_heads else 1, BLOCK_R=block_r,
        BLOCK_N=block_n_w, num_warps=WEIGHTS_TILES["num_warps"],
        **pdl_launch(s_part.device),
    )  # fmt: skip
    return out, scores
