"""Counting host synchronisations: `count_syncs` runs a callable under ``torch.cuda.set_sync_debug_mode("warn")``
and counts the warnings, with the Python line that caused each (file and line of the caller)."""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable

import torch


def count_syncs(fn: Callable[[], object]) -> tuple[object, int, collections.Counter]:
    """Run ``fn`` on a CUDA machine; returns its result, how many host synchronisations it made, and a counter of
    their sites (``path:line``, the path cut after ``hf_sparse_verify`` for our own files)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in record if "synchroniz" in str(w.message)]
    sites = collections.Counter(f"{w.filename.split('hf_sparse_verify')[-1]}:{w.lineno}" for w in syncs)
    return result, len(syncs), sites
