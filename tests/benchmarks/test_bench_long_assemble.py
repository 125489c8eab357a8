"""`benchmarks/bench_long.py assemble`: each speed record is compared with the K = 0 step of its own run (its file),
a case timed twice keeps its latest run, and the projection uses the latest acceptance of the same K and context."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root, holding the benchmarks package
from benchmarks import bench_long  # noqa: E402

MACHINE = dict(commit="c0ffee", date="2026-11-27", gpu="test")


def _speed(strategy: str, k: int, iteration_ms: float) -> dict:
    return dict(batch=4, context=65536, strategy=strategy, k=k, draft_ms=0.0, verify_ms=iteration_ms,
                update_ms=0.0, iteration_ms=iteration_ms, decode_tokens_per_s=1000.0 / iteration_ms)  # fmt: skip


def _write(path: Path, part: str, records: list[dict]) -> str:
    path.write_text(json.dumps(dict(machine=MACHINE, part=part, records=records)))
    return str(path)


def test_records_pair_with_their_own_runs_k0_and_latest_acceptance(tmp_path):
    # two runs of one commit: the first times K = 4 and 6, the second K = 6 again with a slower K = 0 step
    first = _write(tmp_path / "a.json", "speed", [_speed("k0", 0, 10.0), _speed("vegas", 4, 30.0),
                                                   _speed("vegas", 6, 40.0)])  # fmt: skip
    second = _write(tmp_path / "b.json", "speed", [_speed("k0", 0, 12.0), _speed("vegas", 6, 44.0)])
    acc = [dict(variant="vegas", context=16384, k=k, acceptance_length=a) for k, a in ((4, 4.0), (6, 5.0))]
    old_acc = _write(tmp_path / "acc1.json", "acceptance", [dict(acc[1], acceptance_length=9.0)])
    new_acc = _write(tmp_path / "acc2.json", "acceptance", acc)
    out = tmp_path / "long.json"
    args = argparse.Namespace(inputs=[first, second, old_acc, new_acc], out=str(out), vegas_variant="vegas")
    records = {(r["strategy"], r["k"]): r for r in bench_long.assemble(args)["records"]}

    assert records[("k0", 0)]["iteration_ms"] == 12.0  # the latest K = 0 step is the row shown
    assert records[("vegas", 4)]["k0_step_ms"] == 10.0 and records[("vegas", 4)]["k0_run"] == "a.json"
    assert records[("vegas", 4)]["projected_speedup"] == 4.0 * 10.0 / 30.0
    assert records[("vegas", 6)]["iteration_ms"] == 44.0  # timed twice: the latest run
    assert records[("vegas", 6)]["k0_step_ms"] == 12.0 and records[("vegas", 6)]["k0_run"] == "b.json"
    assert records[("vegas", 6)]["projected_speedup"] == 5.0 * 12.0 / 44.0  # the later acceptance file wins
    assert out.with_suffix(".png").stat().st_size > 0
