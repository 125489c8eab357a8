"""Triton n-gram search of prompt lookup: one program per row scans the row's history once per n-gram size in
blocks of positions, keeping the latest occurrence with a full continuation and the earliest occurrence in
registers, then writes the row's draft and count: one launch for the whole batch, where the PyTorch reference
launches about fifteen kernels per n-gram size over ``[B, C]`` temporaries."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: positions compared per iteration of a row's scan
BLOCK = 1024
#: draft lanes of one launch for up to this many draft tokens: one compiled kernel serves every K up to it. K_PAD
#: followed K (2, 4, 8, 16) and Triton specialised on K itself, so the first step at a new K paid a compile inside a
#: call (one H100, run5 of bench_e2e: prompt lookup with the utility policy at 1 x 4K drafted 29 ms per step where
#: K = 4 took 0.16 ms, and the planner's cost profile took those compiles for the price of larger K)
K_LANES = 16


@triton.jit(do_not_specialize=["capacity", "num_tokens"])
def _ngram_lookup_kernel(
    TOKENS, COMMITTED, PAD, DRAFTS, COUNTS,
    capacity, num_tokens,
    MAX_N: tl.constexpr, MIN_N: tl.constexpr, K_PAD: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    row = TOKENS + b.to(tl.int64) * capacity
    committed = tl.load(COMMITTED + b)
    pad = tl.load(PAD + b)
    offs = tl.arange(0, BLOCK)
    source = committed * 0 - 1  # first slot of the continuation (-1: none yet)
    for n in tl.static_range(MAX_N, MIN_N - 1, -1):
        latest_full = committed * 0 - 1
        earliest = committed * 0 + capacity
        # occurrences p in [pad, committed - 1 - n]: the window p .. p + n - 1 ends before the trailing n-gram
        for p0 in range(pad, committed - n, BLOCK):
            p = p0 + offs
            ok = (p >= pad) & (p + n <= committed - 1)
            hit = ok
            for k in tl.static_range(n):
                want = tl.load(row + tl.maximum(committed - n + k, 0))
                hit = hit & (tl.load(row + p + k, mask=ok, other=-1) == want)
            full = hit & (p + n + num_tokens <= committed)
            latest_full = tl.maximum(latest_full, tl.max(tl.where(full, p, -1), axis=0))
            earliest = tl.minimum(earliest, tl.min(tl.where(hit, p, capacity), axis=0))
        start = tl.where(latest_full >= 0, latest_full, tl.where(earliest < capacity, earliest, -1))
        source = tl.where((source < 0) & (start >= 0), start + n, source)
    count = tl.where(source >= 0, tl.minimum(committed - source, num_tokens), 0)
    k = tl.arange(0, K_PAD)
    slots = tl.minimum(tl.maximum(source, 0) + k, capacity - 1)
    tl.store(DRAFTS + b.to(tl.int64) * num_tokens + k, tl.load(row + slots), mask=k < num_tokens)
    tl.store(COUNTS + b, count.to(tl.int64))


@on_input_device
def ngram_lookup_triton(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ngram_lookup_naive` in one launch (``tokens`` contiguous ``[B, C]`` int64; ``committed``, ``pad`` ``[B]``
    int64)."""
    batch, capacity = tokens.shape
    drafts = torch.empty(batch, num_tokens, dtype=tokens.dtype, device=tokens.device)
    counts = torch.empty(batch, dtype=torch.int64, device=tokens.device)
    if batch == 0 or num_tokens == 0:
        counts.zero_()
        return drafts, counts
    _ngram_lookup_kernel[(batch,)](
        tokens, committed, pad, drafts, counts, capacity, num_tokens,
        MAX_N=max_ngram, MIN_N=min_ngram, K_PAD=max(K_LANES, next_power_of_2(num_tokens)), BLOCK=BLOCK,
        **pdl_launch(tokens.device),
    )  # fmt: skip
    return drafts, counts
