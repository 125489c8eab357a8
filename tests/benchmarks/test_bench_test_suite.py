"""`benchmarks/bench_test_suite.py` reads pytest's closing line into counts."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root, holding the benchmarks package
from benchmarks import bench_test_suite  # noqa: E402


def test_counts_and_refusal():
    assert bench_test_suite.counts("3 failed, 1666 passed, 149 skipped in 254.08s (0:04:14)") == {
        "failed": 3,
        "passed": 1666,
        "skipped": 149,
    }
    with pytest.raises(ValueError, match="not a pytest summary"):
        bench_test_suite.counts("collected 12 items")
    assert doctest.testmod(bench_test_suite).failed == 0
