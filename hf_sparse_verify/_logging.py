"""Warnings shown once per process (the bottom layer: imports nothing of the package)."""

from __future__ import annotations

import warnings

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A ``RuntimeWarning`` shown once per process for ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
