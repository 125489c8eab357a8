"""Draw ``results/e2e.json`` (bench_e2e.py) for one device: speed against our K = 0 per shape, and the mixed workload.

Left panel: x groups = shapes (``BxL``), one bar per case (strategy and K or K policy), y = ``vs_k0`` (decode
tokens/s over K = 0's, a line at 1.0). Right panel: the mixed workload, one bar per case, y = K = 0's total time over
the case's (``vs_k0``), each bar labelled with its total seconds.

    python benchmarks/plot_e2e.py [--results benchmarks/results/e2e.json] [--device H100] [--out e2e.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def case_of(record: dict) -> str:
    """The case string of a record: its setting's last part (``<device>:<shape>:<case>``)."""
    setting = (record.get("setting") or "").split("@")[0]  # a "@run" suffix names the run, not the case
    parts = setting.split(":", 2)
    if len(parts) == 3:
        return parts[2]
    k = record.get("num_draft_tokens")
    return f"{record.get('strategy')}:{k if k is not None else record.get('k_policy')}"


def latest_device(records: list[dict]) -> str | None:
    """The device of the most recent record (by its machine's date, else file order)."""
    dated = [
        (str((r.get("machine") or {}).get("date", "")), i, r)
        for i, r in enumerate(records)
        if r.get("device")
    ]
    return max(dated, key=lambda x: (x[0], x[1]))[2]["device"] if dated else None


def _shape_key(shape: str) -> tuple[int, int]:
    batch, _, context = shape.partition("x")
    return (int(context), int(batch)) if batch.isdigit() and context.isdigit() else (0, 0)


def from_runs(records: list[dict], runs: list[str]) -> list[dict]:
    """Per shape, the records of the first of ``runs`` (record field ``run``) that measured it: a figure compares
    cases within one run only."""
    chosen: dict[tuple, str] = {}
    for run in runs:
        for r in records:
            if r.get("run") == run:
                chosen.setdefault(_figure_key(r), run)
    return [r for r in records if r.get("run") is not None and chosen.get(_figure_key(r)) == r.get("run")]


def _figure_key(record: dict) -> tuple:
    """A shape and its prompt kind: a run of random-token prompts does not stand for the held-out prompts' shape."""
    return (record.get("shape"), ":random:" in (record.get("setting") or ""))


def plot(
    records: list[dict], out: str | Path, device: str | None = None, runs: list[str] | None = None
) -> Path:
    """Draw the records of the device whose name contains ``device`` (default the latest) into ``out``; with
    ``runs``, per shape the first of those runs that measured it."""
    if runs:
        records = from_runs(records, runs)
    device = device or latest_device(records) or ""
    mine = [r for r in records if device.lower() in str(r.get("device", "")).lower()]
    if not mine:
        raise SystemExit(f"no record of a device matching {device!r}")
    shaped = [
        r for r in mine
        if r.get("shape") not in (None, "mixed") and r.get("vs_k0") is not None and r.get("prompt") is None
    ]  # fmt: skip
    mixed = [r for r in mine if r.get("shape") == "mixed"]
    shapes = sorted({r["shape"] for r in shaped}, key=_shape_key)
    cases = list(dict.fromkeys(case_of(r) for r in shaped))
    colors = plt.get_cmap("tab20").colors
    color = {
        c: colors[i % len(colors)] for i, c in enumerate(dict.fromkeys(cases + [case_of(r) for r in mixed]))
    }
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(max(7.0, 1.3 * len(shapes) * max(1, len(cases)) / 3) + 4.5, 4.6),
        gridspec_kw=dict(width_ratios=[max(2, len(shapes)), 1.4]),
    )  # fmt: skip
    width = 0.8 / max(1, len(cases))
    by = {(r["shape"], case_of(r)): r["vs_k0"] for r in shaped}
    for j, case in enumerate(cases):
        xs = [i + (j - (len(cases) - 1) / 2) * width for i, s in enumerate(shapes) if (s, case) in by]
        ys = [by[(s, case)] for s in shapes if (s, case) in by]
        ax.bar(xs, ys, width, label=case, color=color[case])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_xlabel("batch x context")
    ax.set_ylabel("decode tokens/s vs our K = 0")
    ax.set_title("per shape", fontsize=10)
    if cases:
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.text(0.5, 0.5, "no per-shape records", ha="center", va="center", transform=ax.transAxes)
    if mixed:
        names = [case_of(r) for r in mixed]
        speed = [r.get("vs_k0") or 0.0 for r in mixed]
        bars = bx.bar(range(len(mixed)), speed, color=[color[n] for n in names])
        for bar, r in zip(bars, mixed):
            bx.annotate(f"{r['total_s']:.1f}s", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
        bx.axhline(1.0, color="k", lw=0.8, ls="--")
        bx.set_xticks(range(len(mixed)), names, rotation=40, ha="right", fontsize=8)
        bx.set_ylabel("speed vs our K = 0 (K = 0 total / total)")
        calls = mixed[0].get("calls")
        bx.set_title(f"mixed workload ({calls} calls, scale {mixed[0].get('mixed_scale', 1.0)})", fontsize=10)
    else:
        bx.text(0.5, 0.5, "no mixed-workload records", ha="center", va="center", transform=bx.transAxes)
        bx.set_xticks([])
    machine = next((r.get("machine") or {} for r in mine if r.get("machine")), {})
    commits = ", ".join(dict.fromkeys(str((r.get("machine") or {}).get("commit", "?"))[:10] for r in mine))
    fig.suptitle(
        f"bench_e2e on {device}: torch {machine.get('torch', '?')}, transformers {machine.get('transformers', '?')}, "
        f"commit {commits} (ratios within one run per shape)",
        fontsize=9,
    )
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(_records.results_path("e2e")), help="an e2e results file")
    parser.add_argument("--device", default=None, help="substring of the device name (default: the latest)")
    parser.add_argument("--out", default=None, help="PNG path (default: the results file's name, .png)")
    parser.add_argument(
        "--runs", nargs="+", default=None, help="records' run names; per shape the first run that measured it"
    )
    args = parser.parse_args(argv)
    out = args.out or Path(args.results).with_suffix(".png")
    path = plot(_records.records(args.results), out, args.device, args.runs)
    print(path)
    return path


if __name__ == "__main__":
    main()
