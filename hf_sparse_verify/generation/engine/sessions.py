"""Sessions kept across ``generate`` calls: a target `ModelRunner` (its preallocated cache and captured graphs)
and whatever its drafter keeps beside it (selection buffers, a draft model's runner), keyed by everything that
decides a graph: model, dtype, device, batch, capacity bucket, backend, K bound and the drafter's own key.

A request of another length reuses a session when its capacity falls in the same bucket (`capacity_bucket`):
the kernels read each row's valid range on the device, so a larger cache costs memory, not time. Sessions are
held least-recently-used first out: at most `SessionCache.max_sessions` of them, and beyond the
`SessionCache.min_sessions` most recent only while the caches they hold fit `SessionCache.max_bytes` (by default
`DEFAULT_BUDGET_SHARE` of the device's memory). A workload of many shapes on a small model keeps every shape's
graphs (one H100, bench_e2e's mixed workload of 15 calls over 13 shape buckets: with 2 sessions kept, every call
captured again, about 5 s each); one of a few large caches keeps as many as fit.
`hf_sparse_verify.clear_graph_cache()` drops them all.
"""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: sessions kept at most by default (each holds a KV cache of its batch x capacity and its graphs)
DEFAULT_MAX_SESSIONS = 32
#: the most recent sessions kept whatever their size (a call and the one before it)
DEFAULT_MIN_SESSIONS = 2
#: share of the device's memory the caches of sessions beyond `DEFAULT_MIN_SESSIONS` may hold
DEFAULT_BUDGET_SHARE = 0.15


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
    """Least-recently-used sessions: at most ``max_sessions``; beyond the ``min_sessions`` most recent, only while
    the caches (`session_bytes`) of those made before the newest fit ``max_bytes`` (None: `DEFAULT_BUDGET_SHARE`
    of the total memory of the device the sessions' caches are on; no byte limit off CUDA). The budget is
    applied when a session is made, before its own cache is allocated (on its first write)."""

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_bytes: int | None = None,
        min_sessions: int = DEFAULT_MIN_SESSIONS,
    ):
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.min_sessions = min_sessions
        self.sessions: OrderedDict[tuple, Session] = OrderedDict()

    def get(self, key: tuple, model, make: Callable[[], object]) -> Session:
        """The session for ``key`` (moved to most recent), or a new one whose target runner ``make()`` builds
        (evicting the least recently used beyond the limits)."""
        session = self.sessions.get(key)
        if session is not None and session.model() is model:
            self.sessions.move_to_end(key)
            session.calls += 1
            return session
        stale = self.sessions.pop(key, None)
        if stale is not None:
            _release(stale)
        self._evict(room=1)
        session = Session(key, weakref.ref(model), make(), calls=1)
        self.sessions[key] = session
        return session

    def budget(self) -> int | None:
        """The byte limit in force (None: none)."""
        if self.max_bytes is not None:
            return self.max_bytes
        device = next((_device(s) for s in reversed(self.sessions.values()) if _device(s) is not None), None)
        if device is None or device.type != "cuda":
            return None
        return int(DEFAULT_BUDGET_SHARE * torch.cuda.get_device_properties(device).total_memory)

    def _evict(self, room: int) -> None:
        """Drops the least recently used sessions until ``room`` more fit the count and the rest fit the budget."""
        while len(self.sessions) + room > max(1, self.max_sessions):
            _release(self.sessions.popitem(last=False)[1])
        budget = self.budget()
        if budget is None:
            return
        while len(self.sessions) + room > max(1, self.min_sessions):
            if sum(session_bytes(s) for s in self.sessions.values()) <= budget:
                return
            _release(self.sessions.popitem(last=False)[1])

    def clear(self) -> None:
        while self.sessions:
            _release(self.sessions.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self.sessions)


def session_bytes(session: Session) -> int:
    """Bytes of the KV caches a session holds: its target's and its drafters' (a draft model's runner)."""
    runners = [session.target]
    state = session.drafter_state
    for part in state.values() if isinstance(state, dict) else [state]:
        if getattr(part, "cache", None) is not None:
            runners.append(part)
    return sum(runner.cache.nbytes for runner in runners if getattr(runner, "cache", None) is not None)


def _device(session: Session) -> torch.device | None:
    cache = getattr(session.target, "cache", None)
    if cache is None:
        return None
    devices = [d for d in cache.layer_devices(None) if d is not None]
    return devices[0] if devices else None


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


def set_graph_cache_size(max_sessions: int, max_bytes: int | None = None) -> None:
    """Keep at most ``max_sessions`` sessions (>= 1) and, beyond the two most recent, only while their caches fit
    ``max_bytes`` (None: `DEFAULT_BUDGET_SHARE` of the device's memory); extra ones are dropped, least recently
    used first."""
    if not isinstance(max_sessions, int) or max_sessions < 1:
        raise ValueError(f"max_sessions must be an int >= 1, got {max_sessions!r}")
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
        raise ValueError(f"max_bytes must be an int >= 0 or None, got {max_bytes!r}")
    SESSIONS.max_sessions = max_sessions
    SESSIONS.max_bytes = max_bytes
    SESSIONS._evict(room=0)
