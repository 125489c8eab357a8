"""Triton n-gram search of prompt lookup, parallel over rows and over blocks of each row's history: one launch.

Program ``(b, c)`` compares the candidate positions ``c * BLOCK .. (c + 1) * BLOCK - 1`` of row ``b`` with the
row's trailing n-gram, for every n-gram size, and folds its block's latest occurrence with a full continuation and
its earliest occurrence into the row's slots of a small int32 ``scratch`` with atomic max. The program that
finishes last in its row (an atomic ticket counts the row's programs) reads the slots and zeroes them for the next
launch, picks the longest n-gram that occurred and writes the row's draft and count. The scratch is therefore all
zeros before and after every launch: allocated once (`new_scratch`), it serves every launch of the same batch and
n-gram sizes on one stream (launches on two streams at once need two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: candidate positions of one program. One H100, the kernel alone in a CUDA graph (`benchmarks/bench_ngram_lookup.py`,
#: repeated text, K = 4) at 1 x 16K / 16 x 16K / 32 x 8K: 256 took 11.3 / 12.5 / 12.6 us, 1024 14.9 / 15.8 / 15.9,
#: 2048 18.7 / 20.2 / 20.4; the kernel before this one (one program per row) 56.5 / 59.0 / 30.5
BLOCK = 256
#: draft lanes of one launch for up to this many draft tokens: one compiled kernel serves every K up to it. K_PAD
#: followed K (2, 4, 8, 16) and Triton specialised on K itself, so the first step at a new K paid a compile inside a
#: call (one H100, run5 of bench_e2e: prompt lookup with the utility policy at 1 x 4K drafted 29 ms per step where
#: K = 4 took 0.16 ms, and the planner's cost profile took those compiles for the price of larger K)
K_LANES = 16
#: the scratch keeps position ``p`` as ``p + 1`` (latest occurrence) and as ``_FAR - p`` (earliest occurrence), so
#: that the larger value wins in both and 0 means "none"
_FAR = tl.constexpr(2**31 - 1)


def scratch_width(max_ngram: int, min_ngram: int) -> int:
    """int32 slots per row: latest full occurrence and earliest occurrence per n-gram size, and the row's ticket."""
    return 2 * (max_ngram - min_ngram + 1) + 1


def new_scratch(batch: int, max_ngram: int, min_ngram: int, device: torch.device) -> torch.Tensor:
    """``[B, scratch_width]`` int32 zeros: the state every launch starts from and leaves behind."""
    return torch.zeros(batch, scratch_width(max_ngram, min_ngram), dtype=torch.int32, device=device)


@triton.jit(do_not_specialize=["capacity", "num_tokens"])
def _ngram_lookup_kernel(
    TOKENS, COMMITTED, PAD, ACTIVE, DRAFTS, COUNTS, SCRATCH,
    capacity, num_tokens,
    MAX_N: tl.constexpr, MIN_N: tl.constexpr, K_PAD: tl.constexpr, BLOCK: tl.constexpr,
    HAS_ACTIVE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    b = tl.program_id(0)
    SIZES: tl.constexpr = MAX_N - MIN_N + 1
    row = TOKENS + b.to(tl.int64) * capacity
    p_scratch = SCRATCH + b * (2 * SIZES + 1)  # [latest_full per n, earliest per n, ticket]
    committed = tl.load(COMMITTED + b)
    pad = tl.load(PAD + b)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # candidate positions of this program
    for n in tl.static_range(MAX_N, MIN_N - 1, -1):
        # occurrences p in [pad, committed - 1 - n]: the window p .. p + n - 1 ends before the trailing n-gram
        ok = (p >= pad) & (p + n <= committed - 1)
        hit = ok
        for k in tl.static_range(n):
            want = tl.load(row + tl.maximum(committed - n + k, 0))
            hit = hit & (tl.load(row + p + k, mask=ok, other=-1) == want)
        full = hit & (p + n + num_tokens <= committed)
        b_latest = tl.max(tl.where(full, p + 1, 0), axis=0)
        b_earliest = tl.max(tl.where(hit, _FAR - p, 0), axis=0)
        tl.atomic_max(p_scratch + (MAX_N - n), b_latest, mask=b_latest > 0)
        tl.atomic_max(p_scratch + SIZES + (MAX_N - n), b_earliest, mask=b_earliest > 0)
    # each program's atomics are ordered before its ticket (acquire-release), so the last one sees them all
    ticket = tl.atomic_add(p_scratch + 2 * SIZES, 1)
    if ticket == tl.num_programs(1) - 1:
        source = committed * 0 - 1  # first slot of the continuation (-1: none yet)
        for n in tl.static_range(MAX_N, MIN_N - 1, -1):
            latest = tl.atomic_xchg(p_scratch + (MAX_N - n), 0) - 1
            earliest = tl.atomic_xchg(p_scratch + SIZES + (MAX_N - n), 0)
            start = tl.where(latest >= 0, latest, tl.where(earliest > 0, _FAR - earliest, -1))
            source = tl.where((source < 0) & (start >= 0), start + n, source)
        tl.atomic_xchg(p_scratch + 2 * SIZES, 0)
        found = source >= 0
        if HAS_ACTIVE:
            found = found & (tl.load(ACTIVE + b) != 0)
        count = tl.where(found, tl.minimum(committed - source, num_tokens), 0)
        lane = tl.arange(0, K_PAD)
        slots = tl.minimum(tl.maximum(source, 0) + lane, capacity - 1)
        tl.store(DRAFTS + b.to(tl.int64) * num_tokens + lane, tl.load(row + slots), mask=lane < num_tokens)
        tl.store(COUNTS + b, count.to(tl.int64))


@on_input_device
def launch_ngram_lookup(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    active: torch.Tensor | None,
    drafts: torch.Tensor,
    counts: torch.Tensor,
    scratch: torch.Tensor,
    max_ngram: int,
    min_ngram: int,
    block: int = BLOCK,
) -> None:
    """`ngram_lookup_naive` into ``drafts [B, K]`` int64 and ``counts [B]`` int64, one launch, nothing checked or
    allocated (the caller's job: `hf_sparse_verify.kernels.ngram_lookup.NgramLookup`).

    ``tokens`` contiguous ``[B, C]`` int64; ``committed``, ``pad`` ``[B]`` int64; ``active`` ``[B]`` bool or None;
    ``scratch`` from `new_scratch` for this batch and these n-gram sizes, not in use by a launch on another stream.
    """
    batch, capacity = tokens.shape
    num_tokens = drafts.shape[1]
    grid = (batch, triton.cdiv(capacity, block))
    _ngram_lookup_kernel[grid](
        tokens, committed, pad, active, drafts, counts, scratch, capacity, num_tokens,
        MAX_N=max_ngram, MIN_N=min_ngram, K_PAD=max(K_LANES, next_power_of_2(num_tokens)), BLOCK=block,
        HAS_ACTIVE=active is not None, **pdl_launch(tokens.device),
    )  # fmt: skip


def ngram_lookup_triton(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ngram_lookup_naive` in one launch, with fresh outputs and scratch (``tokens`` contiguous ``[B, C]`` int64;
    ``committed``, ``pad`` ``[B]`` int64; ``active`` ``[B]`` bool or None)."""
    batch = tokens.shape[0]
    drafts = torch.empty(batch, num_tokens, dtype=tokens.dtype, device=tokens.device)
    counts = torch.empty(batch, dtype=torch.int64, device=tokens.device)
    if batch == 0 or num_tokens == 0:
        return drafts, counts.zero_()
    scratch = new_scratch(batch, max_ngram, min_ngram, tokens.device)
    launch_ngram_lookup(tokens, committed, pad, active, drafts, counts, scratch, max_ngram, min_ngram)
    return drafts, counts
