"""`benchmarks/bench_sparse_quality.py` draws its teacher-forced records: one panel per context, a point and its
bootstrap interval per setting and for the noise floor."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, holding the benchmarks package
from benchmarks.bench_sparse_quality import plot_teacher_forced  # noqa: E402


def _record(setting: str, context: int, delta: float, grade: str) -> dict:
    floor = dict(delta_nll_pct=0.01, delta_nll_ci=[-0.02, 0.04], top1=0.993, kl=0.0002)
    return dict(suite="teacher_forced", setting=setting, context=context, delta_nll_pct=delta,
                delta_nll_ci=[delta - 0.5, delta + 0.5], top1=0.97, kl=0.01, noise_floor=floor,
                **{"class": grade})  # fmt: skip


def test_teacher_forced_plot_draws_each_context(tmp_path):
    records = [
        _record("default", 8192, 0.06, "balanced"),
        _record("attn_rho0.7", 8192, -0.1, "near_exact"),
        _record("default", 16384, 1.79, "fast"),
        {"suite": "fixtures", "setting": "ffn0.5", "context": 8192},  # another suite's record: not drawn
    ]
    out = tmp_path / "tf.png"
    assert plot_teacher_forced(records, str(out)) == str(out)
    assert out.stat().st_size > 10_000
