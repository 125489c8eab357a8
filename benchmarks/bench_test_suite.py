"""The test suite's own cost: ``python -m pytest tests -q`` (pytest-xdist, one worker per core, `pyproject.toml`)
timed as one command, with its pass / fail / skip counts, on the machine it runs on.

    python benchmarks/bench_test_suite.py                       # adds the record "cpu" or "cuda" to test_suite.json
    python benchmarks/bench_test_suite.py --json /tmp/x.json    # a trial run, elsewhere

The record says what the README states about test time: on which machine, with which versions and commit.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: pytest's closing line, e.g. "1669 passed, 149 skipped, 14 warnings in 191.68s (0:03:11)"
SUMMARY = re.compile(r"^=*\s*(?P<counts>(\d+ \w+(, )?)+) in (?P<seconds>[\d.]+)s")


def counts(summary: str) -> dict[str, int]:
    """``{"passed": 1669, "skipped": 149, ...}`` from pytest's closing line.

    Example:
        >>> counts("1669 passed, 149 skipped, 14 warnings in 191.68s (0:03:11)")
        {'passed': 1669, 'skipped': 149, 'warnings': 14}
    """
    match = SUMMARY.match(summary.strip())
    if match is None:
        raise ValueError(f"not a pytest summary line: {summary!r}")
    return {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", match.group("counts"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. '-n 4'")
    _records.add_arguments(parser, "test_suite")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "tests",
        "-q",
        "-p",
        "no:cacheprovider",
        *args.pytest_args.split(),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if SUMMARY.match(line.strip())]
    if not lines:
        raise SystemExit(f"pytest printed no summary (exit {done.returncode}):\n{done.stdout[-3000:]}")
    result = {
        "command": "python -m pytest tests -q" + (f" {args.pytest_args}" if args.pytest_args else ""),
        "exit_status": done.returncode,
        "wall_s": round(wall_s, 1),
        "pytest_s": float(SUMMARY.match(lines[-1].strip()).group("seconds")),
        "cpu_cores": os.cpu_count(),
        "fixtures": bool(os.environ.get("HF_SPARSE_VERIFY_SHARED"))
        or (ROOT.parent / "shared" / "models").is_dir(),
        **counts(lines[-1]),
    }
    print(lines[-1])
    _records.save(args, result, device, setting=device)


if __name__ == "__main__":
    main()
