"""The step spine on the GPU fast path (triton backend + CUDA graphs), float32: one host synchronisation per
step for every strategy, graphs kept across calls (a second call captures nothing, and requests of other lengths
in the same capacity bucket reuse them with identical output), memory bounded over many calls of varied shapes,
and greedy output equal to plain ``generate`` for every strategy. Skipped without a CUDA GPU."""

from __future__ import annotations

import collections
import functools

import pytest
import torch
from conftest import make_model, noisy_copy, ragged_batch

import hf_sparse_verify as hsv
from hf_sparse_verify.drivers.syncs import count_syncs
from hf_sparse_verify.generation.engine.sessions import SESSIONS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

STRATEGIES = {
    "plain": dict(strategy="prompt_lookup", k_policy="plain"),
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "prompt_lookup_utility": dict(strategy="prompt_lookup", k_policy="utility"),
    "draft_model": dict(strategy="draft_model", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "vegas_all": dict(strategy="vegas", selection="all", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "streaming": dict(strategy="streaming", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "quest": dict(strategy="quest", num_draft_tokens=3, ratio=0.3, min_tokens=4, quest_page_size=4),
}


@functools.cache
def _pair():
    model = make_model("llama")
    draft = noisy_copy(model)  # before moving: Module.cuda() moves in place
    return model.cuda(), draft.cuda()


def _run(name: str, ids, mask, max_new: int, batch_prompt=None, max_draft_tokens: int = 8):
    model, draft = _pair()
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new,
        custom_generate=hsv.generate,
        speculation=dict(max_draft_tokens=max_draft_tokens, **STRATEGIES[name]),
        draft_model=draft if STRATEGIES[name]["strategy"] == "draft_model" else None,
        return_dict_in_generate=True,
    )


SYNC_SITES: collections.Counter = collections.Counter()


def _count_syncs(fn):
    """(result, host synchronisations); their sites are added to `SYNC_SITES`."""
    result, count, sites = count_syncs(fn)
    SYNC_SITES.update(sites)
    return result, count


def syncs_per_step(name: str, batch: int = 3) -> tuple[float, int, int]:
    """Synchronisations per decoding step: two warm calls of different lengths, so whatever a call does once
    (setup, prefill, the final assembly) cancels out. Returns (per step, syncs of the longer call, its steps);
    `SYNC_SITES` is left holding, per site, the longer call's count minus the shorter one's."""
    ids, mask = (t.cuda() for t in ragged_batch(batch, 40))
    _run(name, ids, mask, 8)  # capture (kept in the session)
    SYNC_SITES.clear()
    long, n_long = _count_syncs(lambda: _run(name, ids, mask, 40))
    long_sites = collections.Counter(SYNC_SITES)
    SYNC_SITES.clear()
    short, n_short = _count_syncs(lambda: _run(name, ids, mask, 12))
    short_sites = collections.Counter(SYNC_SITES)
    SYNC_SITES.clear()
    for site in set(long_sites) | set(short_sites):
        if long_sites[site] != short_sites[site]:
            SYNC_SITES[site] = long_sites[site] - short_sites[site]
    steps = long.speculation.steps - short.speculation.steps
    return (n_long - n_short) / steps, n_long, long.speculation.steps


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_one_synchronisation_per_step(name):
    per_step, total, steps = syncs_per_step(name)
    assert per_step == pytest.approx(1.0, abs=1e-9), (per_step, total, steps, SYNC_SITES.most_common(8))


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_graphs_kept_across_calls_and_reused_at_other_lengths(name):
    """The first call captures, the second captures nothing; a request of another prompt length and another
    batch content in the same capacity bucket reuses the graphs; every output equals plain generate."""
    model, _ = _pair()
    hsv.clear_graph_cache()
    outs = []
    for length, seed in ((40, 0), (40, 1), (47, 2)):
        ids, mask = (t.cuda() for t in ragged_batch(3, length, seed=seed))
        out = _run(name, ids, mask, 24)
        expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
        assert torch.equal(out.sequences, expected), (name, length, seed)
        outs.append(out.speculation.graph_capture_s)
    assert outs[0] > 0 and outs[1] == 0 and outs[2] == 0, outs
    assert len(SESSIONS) == 1


def test_memory_bounded_over_fifty_varied_calls():
    """50 calls over 3 batch sizes, 6 prompt lengths and 3 strategies: at most `max_sessions` sessions are kept
    and the allocated memory stops growing once they are full. Drafts of at most 3 tokens keep each new session's
    capture to 4 verify widths (nearly every call opens a session)."""
    hsv.clear_graph_cache()
    hsv.set_graph_cache_size(2)
    allocated = []
    names = ["prompt_lookup", "vegas", "draft_model"]
    for i in range(50):
        batch, length = 1 + i % 3, 20 + 37 * (i % 6)
        ids, mask = (t.cuda() for t in ragged_batch(batch, length, seed=i))
        _run(names[i % 3], ids, mask, 8 + i % 5, max_draft_tokens=3)
        allocated.append(torch.cuda.memory_allocated())
        assert len(SESSIONS) <= 2
    assert max(allocated[25:]) <= 1.05 * max(allocated[:25]), allocated
    hsv.clear_graph_cache()


def test_captured_graph_keeps_its_step_slots_alive():
    """A graph captured with a step slot holds that slot, so the slot's id (part of the graph's key) cannot be
    reused by a new slot object that would then find and replay the stale graph."""
    import gc
    import weakref

    from hf_sparse_verify.generation.engine.runner import ModelRunner
    from hf_sparse_verify.integrations import speculation_mode
    from hf_sparse_verify.sparse import LossySparseVerify, SparseMoE
    from hf_sparse_verify.sparse.state import SparseVerifyState
    from hf_sparse_verify.step import Phase

    model, _ = _pair()
    device = torch.device("cuda")
    with speculation_mode(model):
        runner = ModelRunner(model, 1, 64, device, "triton")
        zero = torch.zeros(1, dtype=torch.long, device=device)
        runner.forward(torch.zeros(1, 1, dtype=torch.long, device=device), zero, Phase.PREFILL, kv_len=1)
        layers = model.config.num_hidden_layers
        cfg = LossySparseVerify(attention=None, moe=SparseMoE(rule="budget", max_skip=1, budget=0.5))
        state = SparseVerifyState(cfg, layers, None, runner.cache.layer_devices(device))
        assert runner.capture([2], Phase.VERIFY, verify_sparsity=state)
    alive = weakref.ref(state)
    del state
    gc.collect()
    assert alive() is not None  # the graph holds it
    (entry,) = [g for key, g in runner.graphs.graphs.items() if key[0] is not None]
    assert entry.slots == (alive(),)
