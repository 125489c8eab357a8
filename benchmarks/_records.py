"""One results file per benchmark: ``benchmarks/results/<benchmark>.json``.

The file holds ``{"benchmark": ..., "description": ..., "records": [...]}``. A record is one run of the benchmark at
one setting (its own fields: what the script measured) plus ``setting`` (the name of what was run, e.g. a suite or a
case list) and ``machine`` (GPU, CPU, python, torch, transformers, triton, hf_sparse_verify versions, commit and date,
from `hf_sparse_verify.drivers.machine.machine_info`). Saving a record replaces the record of the same setting and
keeps the others, so the file always holds the current record of every setting.

    from benchmarks import _records
    _records.add_arguments(parser, "kernels")            # --json PATH (default the benchmark's file), --setting
    _records.save(args, result, device, setting="full")  # stamps machine + commit, writes the file
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(benchmark: str) -> Path:
    return RESULTS / f"{benchmark}.json"


def add_arguments(
    parser: argparse.ArgumentParser, benchmark: str, default_setting: str | None = None
) -> None:
    """``--json PATH``: the results file to add the record to (default ``benchmarks/results/<benchmark>.json``;
    give a path under /tmp for smoke runs); ``--setting NAME``: the record's setting (a record of the same setting
    is replaced); ``--no-save``: print only."""
    parser.set_defaults(benchmark=benchmark)
    parser.add_argument(
        "--json",
        default=str(results_path(benchmark)),
        help=f"results file the record is added to (default benchmarks/results/{benchmark}.json)",
    )
    parser.add_argument(
        "--setting",
        default=default_setting,
        help="name of this run's setting; replaces the file's record of the same setting "
        "(default: derived from the arguments)",
    )
    parser.add_argument("--no-save", action="store_true", help="do not write the results file")


def stamp(record: dict, device) -> dict:
    """``record`` with ``machine`` (and its ``commit``) filled in where missing."""
    import torch

    from hf_sparse_verify.drivers.machine import commit, machine_info

    machine = record.get("machine") or machine_info(torch.device(device))
    machine.setdefault("commit", commit())
    return {**record, "machine": machine}


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        return {"benchmark": path.stem, "description": "", "records": []}
    data = json.loads(path.read_text())
    if "benchmark" not in data:  # a bare run written elsewhere: one record
        return {"benchmark": path.stem, "description": "", "records": [data]}
    return data


def add(
    path: str | Path, record: dict, benchmark: str | None = None, description: str | None = None, key: str = "setting"
) -> Path:
    """Write ``record`` into the results file at ``path``, replacing the record of the same ``key`` field (the
    ``setting``, by default)."""
    path = Path(path)
    data = load(path)
    if benchmark:
        data["benchmark"] = benchmark
    if description:
        data["description"] = description
    data["records"] = [r for r in data["records"] if r.get(key) != record.get(key)] + [record]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def save(args: argparse.Namespace, result: dict, device, setting: str | None = None) -> Path | None:
    """Stamp ``result`` (one run) and add it to ``args.json`` under ``args.setting`` (else ``setting``)."""
    record = {"setting": args.setting or setting or "default", **stamp(result, device)}
    if getattr(args, "no_save", False):
        print(json.dumps(record)[:2000])
        return None
    path = add(args.json, record, benchmark=getattr(args, "benchmark", None))
    print(f"wrote record {record['setting']!r} to {path}")
    return path


def records(path: str | Path, setting: str | None = None) -> list[dict]:
    """The records of a results file (all, or those of ``setting``); a bare run file is one record."""
    found = load(path)["records"]
    if setting is not None:
        found = [r for r in found if r.get("setting") == setting]
        if not found:
            raise SystemExit(f"{path}: no record of setting {setting!r}")
    return found


def plot_input(doc: str, per_setting: bool = False) -> tuple[Path, dict]:
    """Command line of the plot scripts: ``FILE --setting NAME`` (default: the file's last record). Returns the
    record and the path its PNGs are named after: ``results/<benchmark>.json`` (``<benchmark>*.png`` beside it), or
    ``results/<benchmark>_<setting>.json`` with ``per_setting``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("file", help="a results file (benchmarks/results/<benchmark>.json) or one run's JSON")
    parser.add_argument("--setting", help="the record to draw (default: the file's last record)")
    args = parser.parse_args()
    record = records(args.file, args.setting)[-1]
    path = Path(args.file)
    if per_setting and record.get("setting"):
        path = path.with_name(f"{path.stem}_{record['setting']}.json")
    return path, record


def main() -> None:
    """``python benchmarks/_records.py add BENCHMARK SETTING RUN.json``: add a run written by a command outside
    ``benchmarks/`` (``hf-sparse-verify bench step --json RUN.json``) to ``benchmarks/results/BENCHMARK.json``;
    ``python benchmarks/_records.py list [BENCHMARK ...]``: each file's settings, machine and commit."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser = sub.add_parser("add", help="add a run's JSON as a record")
    add_parser.add_argument("benchmark")
    add_parser.add_argument("setting")
    add_parser.add_argument("run", help="JSON of one run (with its machine field)")
    list_parser = sub.add_parser("list", help="list the records of results files")
    list_parser.add_argument("benchmarks", nargs="*")
    args = parser.parse_args()
    if args.command == "add":
        run = json.loads(Path(args.run).read_text())
        device = (run.get("machine") or {}).get("device", "cpu")
        path = add(
            results_path(args.benchmark), {"setting": args.setting, **stamp(run, device)}, args.benchmark
        )
        print(f"wrote record {args.setting!r} to {path}")
        return
    names = args.benchmarks or sorted(p.stem for p in RESULTS.glob("*.json"))
    for name in names:
        for record in records(results_path(name)):
            machine = record.get("machine") or {}
            print(
                f"{name:24s} {record.get('setting', '?'):40s} {machine.get('gpu') or machine.get('cpu')}  "
                f"{str(machine.get('commit', '?'))[:10]}  {machine.get('date', '?')}"
            )


if __name__ == "__main__":
    main()
