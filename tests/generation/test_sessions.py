"""The session cache: least recently used out, a count limit, and a byte budget beyond the most recent sessions."""

from __future__ import annotations

import types

import pytest
import torch

import hf_sparse_verify as hsv
from hf_sparse_verify.attention.cache import SpecCache
from hf_sparse_verify.generation.engine import sessions as sessions_module
from hf_sparse_verify.generation.engine.sessions import SessionCache, session_bytes


class _Model(torch.nn.Module):
    pass


def _runner(batch: int, capacity: int):
    """A stand-in target runner: a cache with one written layer of ``batch x capacity`` float32 keys and values."""
    cache = SpecCache(num_layers=1, batch_size=batch, capacity=capacity)
    cache.layers[0].lazy_initialization(torch.zeros(batch, 1, 1, 4), torch.zeros(batch, 1, 1, 4))
    return types.SimpleNamespace(cache=cache, graphs=None)


def test_session_bytes_count_the_target_and_a_draft_models_cache():
    cache = SessionCache(max_sessions=4, max_bytes=None)
    model = _Model()
    session = cache.get(("a",), model, lambda: _runner(2, 64))
    target_bytes = session.target.cache.nbytes
    assert target_bytes == 2 * (2 * 1 * 64 * 4 * 4)  # keys and values, float32
    session.drafter_state = {"draft_model": _runner(2, 64), "vegas": object()}
    assert session_bytes(session) == 2 * target_bytes


def test_budget_evicts_the_oldest_beyond_the_most_recent():
    model = _Model()
    size = _runner(1, 64).cache.nbytes
    cache = SessionCache(max_sessions=32, max_bytes=3 * size, min_sessions=2)
    for i in range(5):
        cache.get((i,), model, lambda: _runner(1, 64))
    # before a new session is made, the older ones are cut to the budget (its own cache is allocated later)
    assert [k[0] for k in cache.sessions] == [1, 2, 3, 4]
    cache.get((3,), model, lambda: pytest.fail("session 3 is kept: no new runner"))
    assert list(cache.sessions)[-1] == (3,)


def test_the_most_recent_sessions_stay_whatever_their_size():
    model = _Model()
    cache = SessionCache(max_sessions=32, max_bytes=1, min_sessions=2)
    for i in range(4):
        cache.get((i,), model, lambda: _runner(1, 64))
    assert [k[0] for k in cache.sessions] == [2, 3]


def test_count_limit_and_small_sessions_all_kept():
    model = _Model()
    size = _runner(1, 64).cache.nbytes
    cache = SessionCache(max_sessions=4, max_bytes=100 * size)
    for i in range(13):
        cache.get((i,), model, lambda: _runner(1, 64))
    assert len(cache) == 4
    roomy = SessionCache(max_sessions=32, max_bytes=100 * size)
    for i in range(13):
        roomy.get((i,), model, lambda: _runner(1, 64))
    assert len(roomy) == 13  # a workload of many small shapes keeps every shape's graphs


def test_no_byte_limit_off_cuda_by_default():
    model = _Model()
    cache = SessionCache(max_sessions=32)
    for i in range(6):
        cache.get((i,), model, lambda: _runner(1, 64))
    assert cache.budget() is None and len(cache) == 6


def test_set_graph_cache_size_checks_and_applies(monkeypatch):
    cache = SessionCache(max_sessions=32)
    monkeypatch.setattr(sessions_module, "SESSIONS", cache)
    model = _Model()
    for i in range(5):
        cache.get((i,), model, lambda: _runner(1, 64))
    sessions_module.set_graph_cache_size(3)
    assert len(cache) == 3
    with pytest.raises(ValueError, match="max_sessions"):
        hsv.set_graph_cache_size(0)
    with pytest.raises(ValueError, match="max_bytes"):
        hsv.set_graph_cache_size(4, max_bytes=-1)
