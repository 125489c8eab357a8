"""Prompt lookup's n-gram search: the incremental per-row index and the batched device search against the plain
scan `lookup_ngram` (the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_sparse_verify.generation.drafters.prompt_lookup import (
    NgramIndex,
    PromptLookupDrafter,
    lookup_ngram,
)
from hf_sparse_verify.generation.engine.state import DecodeState
from hf_sparse_verify.kernels.ngram_lookup import ngram_lookup


@pytest.mark.parametrize("vocab", [3, 8, 50])
@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_index_answers_what_the_scan_answers_as_the_history_grows(vocab, max_ngram, min_ngram):
    rng = np.random.default_rng(vocab * 10 + max_ngram)
    history = rng.integers(0, vocab, size=300)
    index = NgramIndex(max_ngram, min_ngram)
    length = 0
    checked = found = 0
    while length < history.size:
        step = int(rng.integers(1, 6))  # a verify step commits 1 .. K + 1 tokens
        index.extend(history[length : length + step].tolist())
        length = min(history.size, length + step)
        for num_tokens in (1, 3, 8):
            expected = lookup_ngram(history[:length], num_tokens, max_ngram, min_ngram).tolist()
            assert index.lookup(num_tokens) == expected, (length, num_tokens)
            checked += 1
            found += bool(expected)
    assert found > checked // 10  # the histories repeat n-grams: the lookups find continuations


def test_index_of_a_short_history():
    index = NgramIndex(3, 1)
    assert index.lookup(4) == []
    index.extend([7])
    assert index.lookup(4) == []
    index.extend([7])
    assert index.lookup(4) == lookup_ngram(np.array([7, 7]), 4, 3, 1).tolist() == [7]


def test_batched_device_search_matches_the_scan():
    rng = np.random.default_rng(0)
    batch, width = 5, 120
    tokens = torch.from_numpy(rng.integers(0, 6, size=(batch, width)))
    pad = torch.tensor([0, 3, 10, 0, 7])
    committed = torch.tensor([120, 90, 60, 17, 100])
    drafts, counts = ngram_lookup(tokens, committed, pad, 4, 3, 1)  # the drafter's device search
    for row in range(batch):
        expected = lookup_ngram(tokens[row, pad[row] : committed[row]].numpy(), 4, 3, 1).tolist()
        assert counts[row].item() == len(expected)
        assert drafts[row, : len(expected)].tolist() == expected


def test_drafter_indexes_each_request_from_its_own_history():
    drafter = PromptLookupDrafter(3, 1)

    def state_of(rows: list[list[int]]) -> DecodeState:
        ids = torch.tensor(rows)
        return DecodeState.start(ids, [0] * len(rows), ids.shape[1] + 8, 0, False, [])

    first = state_of([[1, 2, 3, 4, 1, 2], [5, 5, 5, 5, 5, 5]])
    draft = drafter.get_candidates(first, 2)
    assert draft.tokens.tolist() == [[3, 4], [5, 5]] and draft.counts.tolist() == [2, 2]
    assert draft.host_counts == [2, 2]
    drafter.close()
    second = state_of([[9, 8, 7, 6, 9, 8], [1, 2, 3, 4, 5, 6]])  # nothing of the first request may leak in
    draft = drafter.get_candidates(second, 3)
    assert draft.tokens[0].tolist() == [7, 6, 9] and draft.counts.tolist() == [3, 0]
