"""Attention backends behind the ``"sparse_verify"`` attention: a name-keyed registry.

A backend is ``fn(module, query, key, value, step_view, *, scaling, sliding_window, mods) -> [B, q, H, D_v]``
with ``query`` ``[B, H, q, D]``, ``key``/``value`` the full cache buffers ``[B, H_kv, capacity, D]`` /
``[B, H_kv, capacity, D_v]`` and ``mods`` the layer's soft-capping and sinks (`reference.LogitMods`). The loop
names the backend in `StepContext.backend`; kernels and sparse modes of later issues register their own names here
without touching the loop.
"""

from __future__ import annotations

from collections.abc import Callable

BACKENDS: dict[str, Callable] = {}


def register_backend(name: str, fn: Callable | None = None):
    """Register ``fn`` under ``name`` (usable as a decorator)."""

    def add(f: Callable) -> Callable:
        BACKENDS[name] = f
        return f

    return add(fn) if fn is not None else add


def get_backend(name: str) -> Callable:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; registered: {sorted(BACKENDS)}") from None
