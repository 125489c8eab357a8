"""Prompt lookup's n-gram search: the Triton kernel (CPU interpreter without a GPU) against the PyTorch reference,
and the reference against the host search (`lookup_ngram`) row by row."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch

from hf_sparse_verify.generation.drafters.prompt_lookup import lookup_ngram
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.ngram_lookup import naive, ngram_lookup, ngram_lookup_naive, op

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


@needs_triton
@pytest.mark.parametrize("capacity", [7, 63, 500, 2049])
@pytest.mark.parametrize("num_tokens", [1, 4, 9])
@pytest.mark.parametrize("ngrams", [(3, 1), (2, 2), (4, 2)])
def test_kernel_matches_reference(capacity, num_tokens, ngrams):
    tokens, committed, pad = make_case(capacity=capacity)
    committed = committed.clamp(max=capacity)
    args = [t.to(DEVICE) for t in (tokens, committed, pad)]
    want_d, want_c = ngram_lookup_naive(*args, num_tokens, *ngrams)
    got_d, got_c = ngram_lookup(*args, num_tokens, *ngrams, kernel=True)
    assert torch.equal(got_c.cpu(), want_c.cpu())
    keep = torch.arange(num_tokens)[None, :] < want_c.cpu()[:, None]  # only a row's first `count` are defined
    assert torch.equal(torch.where(keep, got_d.cpu(), 0), torch.where(keep, want_d.cpu(), 0))


@pytest.mark.parametrize("seed", range(4))
def test_reference_matches_host_search_row_by_row(seed):
    tokens, committed, pad = make_case(seed=seed)
    drafts, counts = ngram_lookup_naive(tokens, committed, pad, 5, 3, 1)
    for b in range(tokens.shape[0]):
        history = tokens[b, pad[b] : committed[b]].numpy()
        expected = lookup_ngram(np.asarray(history), 5, 3, 1).tolist()
        assert drafts[b, : counts[b]].tolist() == expected


def test_bad_input():
    tokens, committed, pad = make_case()
    with pytest.raises(ValueError, match="int64 \\[B, C\\]"):
        ngram_lookup(tokens.int(), committed, pad, 4, 3, 1)
    with pytest.raises(ValueError, match="committed must be int64"):
        ngram_lookup(tokens, committed[:2], pad, 4, 3, 1)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        ngram_lookup(tokens, committed, pad, 4, 1, 3)


def test_docstring_examples():
    assert sum(doctest.testmod(m).attempted for m in (naive, op)) >= 2
    assert all(doctest.testmod(m).failed == 0 for m in (naive, op))
