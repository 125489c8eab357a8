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
from hf_sparse_verify.kernels._triton import triton_runs_on
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


def _repetitive_state(batch=5, width=90, capacity=120, seed=0) -> DecodeState:
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(3, 9, size=(batch, width)))
    pads = [0, 4, 0, 17, 2][:batch]
    for row, pad in enumerate(pads):
        ids[row, :pad] = 0
    return DecodeState.start(ids, pads, capacity, 0, False, [])


def _host_drafts(state: DecodeState, num_tokens: int) -> list[list[int]]:
    committed = state.committed_t.tolist()
    return [
        lookup_ngram(state.tokens[row, state.pad[row] : committed[row]].numpy(), num_tokens, 3, 1).tolist()
        if state.active_t[row]
        else []
        for row in range(state.batch_size)
    ]


@pytest.mark.parametrize("kernel", [None, True])  # None: the reference on CPU; True: the kernel, interpreted
def test_device_search_follows_the_steps_of_a_request(kernel, monkeypatch):
    from hf_sparse_verify.generation.drafters import prompt_lookup

    if kernel and not triton_runs_on(torch.device("cpu")):
        pytest.skip("needs Triton's CPU interpreter")
    monkeypatch.setattr(prompt_lookup, "DEVICE_SEARCH_KERNEL", kernel)
    drafter = PromptLookupDrafter(3, 1)
    state = _repetitive_state()
    assert drafter.searches_on_device(state)
    rng = np.random.default_rng(1)
    for step in range(6):
        if step == 3:  # a row stops: it drafts nothing from now on
            state.active_t[1] = False
        for num_tokens in (4, 7):
            draft = drafter.get_candidates(state, num_tokens)
            proposed = drafter.propose(state, num_tokens)
            expected = _host_drafts(state, num_tokens)
            assert draft.host_counts is None
            assert draft.counts.tolist() == proposed[1].tolist() == [len(e) for e in expected]
            for row, tokens in enumerate(expected):
                assert (
                    draft.tokens[row, : len(tokens)].tolist()
                    == tokens
                    == proposed[0][row, : len(tokens)].tolist()
                )
        accepted = torch.from_numpy(rng.integers(0, 3, size=state.batch_size))
        state.advance(accepted, torch.from_numpy(rng.integers(3, 9, size=(state.batch_size, 3))))


@pytest.mark.skipif(not triton_runs_on(torch.device("cpu")), reason="needs Triton's CPU interpreter")
def test_device_search_keeps_its_buffers_per_layout_and_checks_each_request(monkeypatch):
    from hf_sparse_verify.generation.drafters import prompt_lookup

    monkeypatch.setattr(prompt_lookup, "DEVICE_SEARCH_KERNEL", True)
    drafter = PromptLookupDrafter(3, 1)
    first = drafter.get_candidates(_repetitive_state(), 4)
    again = drafter.get_candidates(_repetitive_state(seed=1), 4)  # a new request of the same layout
    assert again.tokens is first.tokens and again.counts is first.counts
    assert drafter.propose(_repetitive_state(), 4)[0] is not first.tokens  # propose has buffers of its own
    other = drafter.get_candidates(_repetitive_state(capacity=150), 4)  # another layout
    assert other.tokens is not first.tokens and other.tokens.shape == (5, 4)
    drafter.close()
    broken = _repetitive_state(capacity=150)
    broken.pad_t = broken.pad_t.int()
    with pytest.raises(ValueError, match="pad must be int64"):
        drafter.get_candidates(broken, 4)
