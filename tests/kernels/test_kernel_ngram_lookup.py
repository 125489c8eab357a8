"""Prompt lookup's n-gram search: the Triton kernel (CPU interpreter without a GPU) against the PyTorch reference,
bit for bit (drafts and counts), over histories split into many blocks; the prepared `NgramLookup`; and the
reference against the host search (`lookup_ngram`) row by row."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

from hf_sparse_verify.generation.drafters.prompt_lookup import lookup_ngram
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.ngram_lookup import NgramLookup, naive, ngram_lookup, ngram_lookup_naive, op

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")) and not torch.cuda.is_available(),
    reason="needs Triton (interpreter or CUDA)",
)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_case(batch=5, capacity=300, vocab=6, seed=0):
    """Rows of a few distinct tokens (so n-grams recur), with different pads and history ends: one row's history
    is a single token, one fills the buffer, one has none of its trailing n-grams earlier (fresh tokens)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, capacity), generator=gen)
    pad = torch.tensor([0, 3, 7, 0, 1][:batch])
    committed = torch.tensor([capacity, capacity - 5, 8, capacity // 2, 2][:batch])
    tokens[3, committed[3] - 3 : committed[3]] = torch.tensor([100, 101, 102])  # never seen before
    return tokens, committed, pad


def make_spread_case(capacity=700, seed=0):
    """Seven rows of distinct tokens (no accidental matches) whose trailing n-gram recurs in places far apart, so
    in several of the kernel's blocks: the latest occurrence with a full continuation in a late block, one whose
    latest occurrence is full only for small K, one with no full occurrence for large K (the earliest wins), one
    with occurrences before its pad, one matching only on its trailing 2-gram, one with no match at all, and
    histories ending at, next to and far from the buffer's end."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(10_000, generator=gen)[: 7 * capacity].view(7, capacity) + 1000
    pattern = torch.tensor([7, 8, 9])
    committed = torch.tensor([capacity, capacity - 1, 400, 650, 500, 610, 333])
    pad = torch.tensor([0, 5, 0, 260, 130, 0, 11])
    spots = {
        0: [3, 130, 255, 640],  # 640 is the latest, full for every K here
        1: [0, 5, 333, 693],  # 0 is before the pad, 5 at it; 693 has 3 tokens after it: full for K <= 3 only
        2: [63, 390],  # 63 straddles block edges; 390 is full for K <= 7, else the earliest (63) wins
        3: [30, 250, 258, 261],  # only 261 starts at or after the pad (258 straddles it)
        4: [128, 131, 480],  # 128 starts before the pad
    }
    for row, starts in spots.items():
        for start in starts:
            tokens[row, start : start + 3] = pattern
        tokens[row, committed[row] - 3 : committed[row]] = pattern
    tokens[5, [17, 18, 300, 301]] = torch.tensor(
        [8, 9, 8, 9]
    )  # the trailing 2-gram (8, 9) recurs, not (7, 8, 9)
    tokens[5, committed[5] - 2 : committed[5]] = torch.tensor([8, 9])
    return tokens, committed, pad


def assert_same(got, want):
    (got_d, got_c), (want_d, want_c) = got, want
    assert torch.equal(got_c.cpu(), want_c.cpu()), (got_c, want_c)
    assert torch.equal(got_d.cpu(), want_d.cpu()), (got_d, want_d)


@needs_triton
@pytest.mark.parametrize("capacity", [7, 63, 500, 2049])
@pytest.mark.parametrize("num_tokens", [1, 4, 9])
@pytest.mark.parametrize("ngrams", [(3, 1), (2, 2), (4, 2)])
def test_kernel_matches_reference(capacity, num_tokens, ngrams):
    tokens, committed, pad = make_case(capacity=capacity)
    committed = committed.clamp(max=capacity)
    args = [t.to(DEVICE) for t in (tokens, committed, pad)]
    assert_same(
        ngram_lookup(*args, num_tokens, *ngrams, kernel=True), ngram_lookup_naive(*args, num_tokens, *ngrams)
    )


@needs_triton
@pytest.mark.parametrize(("block", "num_tokens"), [(32, 3), (32, 20), (64, 1), (64, 8), (128, 16), (1024, 3)])
def test_blocks_of_one_row_combine_to_the_reference(block, num_tokens):
    from hf_sparse_verify.kernels.ngram_lookup.kernel import launch_ngram_lookup, new_scratch

    tokens, committed, pad = (t.to(DEVICE) for t in make_spread_case())
    active = torch.tensor([True, True, True, False, True, True, True], device=DEVICE)
    want = ngram_lookup_naive(tokens, committed, pad, num_tokens, 3, 1, active)
    found = ngram_lookup_naive(tokens, committed, pad, num_tokens, 3, 1)[1] > 0
    assert found.tolist() == [True] * 6 + [False] and want[1][3] == 0  # the case is what it says
    drafts = torch.full((7, num_tokens), -7, dtype=torch.long, device=DEVICE)  # poisoned: all must be written
    counts = torch.full((7,), -7, dtype=torch.long, device=DEVICE)
    scratch = new_scratch(7, 3, 1, DEVICE)
    empty = scratch.clone()
    for _ in range(2):  # the second launch starts from the scratch the first left behind
        launch_ngram_lookup(tokens, committed, pad, active, drafts, counts, scratch, 3, 1, block=block)
        assert_same((drafts, counts), want)
        assert torch.equal(scratch, empty)


@needs_triton
@pytest.mark.parametrize("seed", range(3))
def test_random_histories_with_random_pads_and_activity(seed):
    from hf_sparse_verify.kernels.ngram_lookup.kernel import launch_ngram_lookup, new_scratch

    gen = torch.Generator().manual_seed(seed)
    batch, capacity = 7, 1 + int(torch.randint(1, 600, (1,), generator=gen))
    tokens = torch.randint(0, 4, (batch, capacity), generator=gen)
    committed = torch.randint(1, capacity + 1, (batch,), generator=gen)
    committed[0] = capacity
    pad = (torch.rand(batch, generator=gen) * committed).long()
    active = torch.rand(batch, generator=gen) > 0.3
    args = [t.to(DEVICE) for t in (tokens, committed, pad, active)]
    for num_tokens, (max_n, min_n) in [(4, (3, 1)), (16, (4, 2)), (5, (1, 1))]:
        drafts = torch.empty(batch, num_tokens, dtype=torch.long, device=DEVICE)
        counts = torch.empty(batch, dtype=torch.long, device=DEVICE)
        scratch = new_scratch(batch, max_n, min_n, DEVICE)
        launch_ngram_lookup(*args, drafts, counts, scratch, max_n, min_n, block=32)
        assert_same((drafts, counts), ngram_lookup_naive(*args[:3], num_tokens, max_n, min_n, args[3]))


@needs_triton
def test_prepared_search_reuses_its_outputs_and_follows_the_inputs():
    tokens, committed, pad = (t.to(DEVICE) for t in make_spread_case())
    active = torch.ones(7, dtype=torch.bool, device=DEVICE)
    search = NgramLookup(7, tokens.shape[1], 4, 3, 1, DEVICE, kernel=True)
    search.check(tokens, committed, pad, active)
    first = search(tokens, committed, pad, active)
    assert_same(first, ngram_lookup_naive(tokens, committed, pad, 4, 3, 1, active))
    assert first[0] is search.drafts and first[1] is search.counts
    committed -= 1  # a shorter history: the same buffers, the new answer
    active[2] = False
    assert_same(
        search(tokens, committed, pad, active), ngram_lookup_naive(tokens, committed, pad, 4, 3, 1, active)
    )


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=needs_triton)])
def test_prepared_search_without_work(kernel):
    tokens, committed, pad = make_case()
    args = [t.to(DEVICE) for t in (tokens, committed, pad)]
    drafts, counts = NgramLookup(5, 300, 0, 3, 1, DEVICE, kernel=kernel)(*args)
    assert drafts.shape == (5, 0) and counts.tolist() == [0] * 5
    drafts, counts = NgramLookup(0, 300, 4, 3, 1, DEVICE, kernel=kernel)(*(t[:0] for t in args))
    assert drafts.shape == (0, 4) and counts.shape == (0,)


def test_prepared_search_on_the_reference():
    tokens, committed, pad = make_case()
    active = torch.tensor([True, False, True, True, True])
    search = NgramLookup(5, 300, 6, 3, 1, tokens.device, kernel=False)
    assert_same(
        search(tokens, committed, pad, active), ngram_lookup_naive(tokens, committed, pad, 6, 3, 1, active)
    )


def test_inactive_rows_count_zero():
    tokens, committed, pad = make_case()
    active = torch.tensor([True, False, True, True, False])
    _, every = ngram_lookup_naive(tokens, committed, pad, 4, 3, 1)
    _, counts = ngram_lookup(tokens, committed, pad, 4, 3, 1, active=active)
    assert counts.tolist() == (every * active).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_reference_matches_host_search_row_by_row(seed):
    tokens, committed, pad = make_case(seed=seed)
    drafts, counts = ngram_lookup_naive(tokens, committed, pad, 5, 3, 1)
    for b in range(tokens.shape[0]):
        history = tokens[b, pad[b] : committed[b]].numpy()
        expected = lookup_ngram(np.asarray(history), 5, 3, 1).tolist()
        assert drafts[b, : counts[b]].tolist() == expected


def test_reference_on_the_spread_case_matches_host_search():
    tokens, committed, pad = make_spread_case()
    for num_tokens in (1, 3, 8):
        drafts, counts = ngram_lookup_naive(tokens, committed, pad, num_tokens, 3, 1)
        for b in range(tokens.shape[0]):
            expected = lookup_ngram(tokens[b, pad[b] : committed[b]].numpy(), num_tokens, 3, 1).tolist()
            assert drafts[b, : counts[b]].tolist() == expected


def test_bad_input():
    tokens, committed, pad = make_case()
    with pytest.raises(ValueError, match="int64 \\[B, C\\]"):
        ngram_lookup(tokens.int(), committed, pad, 4, 3, 1)
    with pytest.raises(ValueError, match="committed must be int64"):
        ngram_lookup(tokens, committed[:2], pad, 4, 3, 1)
    with pytest.raises(ValueError, match="active must be bool"):
        ngram_lookup(tokens, committed, pad, 4, 3, 1, active=committed)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        ngram_lookup(tokens, committed, pad, 4, 1, 3)
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        NgramLookup(5, 300, -1, 3, 1, tokens.device)
    search = NgramLookup(5, 300, 4, 3, 1, tokens.device, kernel=False)
    with pytest.raises(ValueError, match="contiguous \\[5, 300\\]"):
        search.check(tokens[:, :200], committed, pad, None)
    with pytest.raises(ValueError, match="contiguous \\[5, 300\\]"):
        search.check(torch.cat([tokens, tokens], dim=1)[:, ::2], committed, pad, None)
    with pytest.raises(ValueError, match="pad must be int64"):
        search.check(tokens, committed, pad.int(), None)


@needs_triton
def test_bench_entry_runs():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["ngram_lookup"](DEVICE, torch.float32, True))
    assert [c.variant for c in cases] == ["triton", "torch"]
    assert_same(cases[0].run(), cases[1].run())


def test_docstring_examples():
    assert sum(doctest.testmod(m).attempted for m in (naive, op)) >= 3
    assert all(doctest.testmod(m).failed == 0 for m in (naive, op))
