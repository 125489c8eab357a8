"""Triton per-row top-k slot selection: one program per (layer, row) finds the ``count``-th largest key by a
4-pass radix select over 8-bit digits (a 256-bin histogram per pass), then writes the chosen slots in ascending
order with a running prefix sum: no sort, no ``torch.topk``.

Pass 0 turns each slot's (max-pooled) score into an order-preserving unsigned key: invalid slots (outside the
prefix) 0, the kept recent window ``0xFFFFFFFF``, the rest the float's bits mapped so that unsigned order is float
order. The keys go to a scratch row (``[N * B, L]`` int32) that the five later passes read (L2-resident at the
sizes the engine uses). Ties at the threshold take the lower slots first, as the reference's stable sort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait


@triton.jit
def _ordered_key(x):
    # float32 -> uint32 with the same order: flip every bit of a negative float, only the sign bit of the others
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _topk_slots_kernel(
    SCORES, PAD, RECENT_START, COUNT, WINDOW, KEYS, OUT,
    batch, length, k_slots, s_layer, s_row,
    POOL: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    pid = tl.program_id(0)
    n = pid // batch
    b = pid % batch
    pad = tl.load(PAD + b)
    recent_start = tl.load(RECENT_START + b)
    count = tl.load(COUNT + b).to(tl.int32)
    if HAS_WINDOW:
        window_lo = recent_start - tl.load(WINDOW + b)
    else:
        window_lo = recent_start
    p_src = SCORES + n.to(tl.int64) * s_layer + b.to(tl.int64) * s_row
    p_keys = KEYS + pid.to(tl.int64) * length
    p_out = OUT + pid.to(tl.int64) * k_slots
    offs0 = tl.arange(0, BLOCK)

    # pass 0: the (pooled) score of every slot as an ordered key, and the histogram of the keys' top 8 bits
    bins = tl.arange(0, 256)
    hist = tl.zeros([256], tl.int32)
    for c in range(0, length, BLOCK):
        offs = c + offs0
        b_best = tl.full([BLOCK], float("-inf"), tl.float32)
        for j in tl.static_range(POOL):
            o = offs + (j - POOL // 2)
            ok = (o >= pad) & (o < recent_start)
            b_best = tl.maximum(b_best, tl.load(p_src + o, mask=ok, other=float("-inf")).to(tl.float32))
        key = _ordered_key(b_best)
        key = tl.where(offs >= window_lo, tl.full([BLOCK], 0xFFFFFFFF, tl.uint32), key)
        key = tl.where((offs >= pad) & (offs < recent_start), key, tl.zeros([BLOCK], tl.uint32))
        tl.store(p_keys + offs, key.to(tl.int32, bitcast=True), mask=offs < length)
        hist += tl.histogram((key >> 24).to(tl.int32), 256)
    hist -= tl.where(
        bins == 0, tl.cdiv(length, BLOCK) * BLOCK - length, 0
    )  # the last chunk's tail went to bin 0

    # passes 1-4: the key of the count-th largest slot, 8 bits at a time (pass p > 1 counts only the keys whose
    # higher digits match the prefix found so far; the others go to bin 0 and are taken out again)
    need = tl.maximum(count, 1)
    prefix = tl.zeros([], tl.uint32)
    for p in tl.static_range(4):
        shift = 24 - 8 * p
        if p > 0:
            hist = tl.zeros([256], tl.int32)
            others = tl.zeros([], tl.int32)
            for c in range(0, length, BLOCK):
                offs = c + offs0
                key = tl.load(p_keys + offs, mask=offs < length, other=0).to(tl.uint32, bitcast=True)
                match = ((key >> (shift + 8)) == (prefix >> (shift + 8))) & (offs < length)
                hist += tl.histogram(tl.where(match, ((key >> shift) & 255).to(tl.int32), 0), 256)
                others += tl.sum((~match).to(tl.int32), 0)
            hist -= tl.where(bins == 0, others, 0)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys (of this prefix) with digit >= d
        d = tl.sum((at_least >= need).to(tl.int32), 0) - 1
        need -= tl.sum(tl.where(bins == d, at_least - hist, 0), 0)  # the keys above digit d are all taken
        prefix = prefix | (d.to(tl.uint32) << shift)

    # final pass: keys above the threshold, and the first `need` equal to it, in slot order
    taken = tl.zeros([], tl.int32)
    equal_seen = tl.zeros([], tl.int32)
    for c in range(0, length, BLOCK):
        offs = c + offs0
        in_row = offs < length
        key = tl.load(p_keys + offs, mask=in_row, other=0).to(tl.uint32, bitcast=True)
        above = (key > prefix) & in_row
        equal = ((key == prefix) & in_row).to(tl.int32)
        rank = equal_seen + tl.cumsum(equal, 0) - equal
        chosen_i = (above | ((equal > 0) & (rank < need))).to(tl.int32) * (count > 0).to(tl.int32)
        chosen = chosen_i > 0
        pos = taken + tl.cumsum(chosen_i, 0) - chosen_i
        tl.store(p_out + pos, offs.to(tl.int64), mask=chosen)
        taken += tl.sum(chosen_i, 0)
        equal_seen += tl.sum(equal, 0)
    for c in range(0, k_slots, BLOCK):
        cols = c + offs0
        tl.store(p_out + cols, tl.zeros([BLOCK], tl.int64), mask=(cols < k_slots) & (cols >= count))


#: slots per chunk of a program's passes over its row, and warps per program. Measured on an H200 (32 layers, 7%
#: kept, pool 7, `benchmarks/diag_vegas_update.py`, us per update): 16 x 16K 216 (torch.topk path 455; best 212 at
#: 2048 / 8 warps), 4 x 64K 262 (573; best 249 at 8192 / 16), 1 x 64K 257 (343; best 241 at 8192 / 16).
BLOCK = 4096
NUM_WARPS = 16


@on_input_device
def topk_slots_triton(
    scores: torch.Tensor,
    pad: torch.Tensor,
    recent_start: torch.Tensor,
    count: torch.Tensor,
    k_slots: int,
    recent: torch.Tensor | None = None,
    pool: int = 1,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Launch; arguments as `hf_sparse_verify.kernels.topk_slots.topk_slots` (checked there). ``[N, B, k_slots]``.
    ``block`` / ``num_warps``: chunk of slots per loop step and warps per program (benchmarks sweep them)."""
    layers, batch, length = scores.shape
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    keys = torch.empty(layers * batch, length, dtype=torch.int32, device=scores.device)
    out = torch.empty(layers, batch, k_slots, dtype=torch.int64, device=scores.device)
    block = min(block, max(16, next_power_of_2(max(length, k_slots))))
    _topk_slots_kernel[(layers * batch,)](
        scores, pad, recent_start, count, recent if recent is not None else count, keys, out,
        batch, length, k_slots, scores.stride(0), scores.stride(1),
        POOL=pool, HAS_WINDOW=recent is not None, BLOCK=block, num_warps=num_warps,
        **pdl_launch(scores.device),
    )  # fmt: skip
    return out
