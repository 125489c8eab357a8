"""Counting host synchronisations: `count_syncs` runs a callable under ``torch.cuda.set_sync_debug_mode("warn")``
and counts the warnings raised from inside this library, with the Python line that caused each.

Only synchronisations with a frame of ``hf_sparse_verify`` (outside this ``bench`` package) on their stack count:
transformers' ``generate`` makes a few of its own before it hands over to ``custom_generate`` (for example
``_prepare_special_tokens`` reads its EOS tensor), and those are not the library's and not per step. Their number
even differs between two calls of one shape (measured on an H200: one more in a 40-token call than in a 12-token
call), which made a long-minus-short difference read 1.04 syncs per step for a loop that makes one.
"""

from __future__ import annotations

import collections
import traceback
import warnings
from collections.abc import Callable

import torch

_OURS = "hf_sparse_verify"
_HARNESS = ("hf_sparse_verify/drivers/", "hf_sparse_verify\\bench\\")


def _ours(stack: list[traceback.FrameSummary]) -> traceback.FrameSummary | None:
    """The innermost frame of this library (outside the bench harness) on ``stack``, or None."""
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if f"/{_OURS}/" in path and not any(h in path for h in _HARNESS):
            return frame
    return None


def watch_syncs(fn: Callable[[], object], on_sync: Callable[[list[traceback.FrameSummary]], None]) -> object:
    """Run ``fn`` on a CUDA machine under ``torch.cuda.set_sync_debug_mode("warn")``, calling ``on_sync`` with the
    Python stack of every host synchronisation (any code's); returns ``fn``'s result."""

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            on_sync([f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")])

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)


def count_syncs(fn: Callable[[], object]) -> tuple[object, int, collections.Counter]:
    """Run ``fn`` on a CUDA machine; returns its result, how many host synchronisations this library made, and a
    counter of their sites (``path:line`` of the innermost library frame, the path cut after ``hf_sparse_verify``)."""
    sites: collections.Counter = collections.Counter()

    def record(stack: list[traceback.FrameSummary]) -> None:
        frame = _ours(stack)
        if frame is not None:
            sites[f"{frame.filename.split(_OURS)[-1]}:{frame.lineno}"] += 1

    result = watch_syncs(fn, record)
    return result, sum(sites.values()), sites
