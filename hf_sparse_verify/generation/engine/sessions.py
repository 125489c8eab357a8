"""Sessions kept across ``generate`` calls: a target `ModelRunner` (its preallocated cache and captured graphs)
and whatever its drafter keeps beside it (selection buffers, a draft model's runner), keyed by everything that
decides a graph: model, dtype, device, batch, capacity bucket, backend, K bound and the drafter's own key.

A request of another length reuses a session when its capacity falls in the same bucket (`capacity_bucket`):
the kernels read each row's valid range on the device, so a larger cache costs memory, not time. Sessions are
held least-recently-used first out, at most `SessionCache.max_sessions` of them;
`hf_sparse_verify.clear_graph_cache()` drops them all.
"""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: sessions kept by default (each holds a KV cache of its batch x capacity and its graphs)
DEFAULT_MAX_SESSIONS = 2


def capacity_bucket(needed: int) -> int:
    """Cache slots for a request that needs ``needed``: rounded up to 1/8 of its power of two (at most 12.5%
    more), at least 256.

    Example:
        >>> capacity_bucket(3000), capacity_bucket(4096), capacity_bucket(4097), capacity_bucket(100)
        (3072, 4096, 4608, 256)
    """
    needed = max(needed, 256)
    step = 1 << max(0, needed.bit_length() - 4)
    return -(-needed // step) * step


@dataclass
class Session:
    """A target runner and its drafter's persistent part, reused by calls with the same key."""

    key: tuple
    model: weakref.ref
    target: object  # ModelRunner
    drafter_state: object | None = None  # owned by the drafter class that made it
    sparse_state: object | None = None  # the lossy sparse-verification slot (hf_sparse_verify.sparse.state)
    calls: int = 0


class SessionCache:
    """Least-recently-used sessions, at most ``max_sessions``."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS):
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[tuple, Session] = OrderedDict()

    def get(self, key: tuple, model, make: Callable[[], object]) -> Session:
        """The session for ``key`` (moved to most recent), or a new one whose target runner ``make()`` builds
        (evicting the least recently used beyond ``max_sessions``)."""
        session = self.sessions.get(key)
        if session is not None and session.model() is model:
            self.sessions.move_to_end(key)
            session.calls += 1
            return session
        stale = self.sessions.pop(key, None)
        if stale is not None:
            _release(stale)
        while len(self.sessions) >= max(1, self.max_sessions):
            _release(self.sessions.popitem(last=False)[1])
        session = Session(key, weakref.ref(model), make(), calls=1)
        self.sessions[key] = session
        return session

    def clear(self) -> None:
        while self.sessions:
            _release(self.sessions.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self.sessions)


def _release(session: Session) -> None:
    """Free a session's device memory now: its runner and graphs refer to each other, so without this the
    memory would wait for Python's cycle collector (and a new session of the same size would not fit)."""
    session.target.graphs = None
    session.target.cache = None
    session.drafter_state = None
    session.sparse_state = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


SESSIONS = SessionCache()


def clear_graph_cache() -> None:
    """Drop every kept session (caches and CUDA graphs) and return the freed memory to the device."""
    SESSIONS.clear()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def set_graph_cache_size(max_sessions: int) -> None:
    """Keep at most ``max_sessions`` sessions (>= 1); extra ones are dropped, least recently used first."""
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    SESSIONS.max_sessions = max_sessions
    while len(SESSIONS.sessions) > max_sessions:
        _release(SESSIONS.sessions.popitem(last=False)[1])
