"""Issue 39's projection for low-bit drafts: `bench_long.py speed` step times (GPU, 8B shape, random weights) joined
with the acceptance of the same strategy and draft weights on the trained fixture (`bench_low_bit_acceptance.py`,
CPU, float32), into one record of ``benchmarks/results/long_low_bit.json`` and a PNG beside it.

    python benchmarks/low_bit_projection.py speed_a.json speed_b.json --setting h100:0740e2b

``projected_speedup`` = acceptance_length x k0_step_ms / iteration_ms: tokens per step of the trained fixture (the
same strategy, draft weights and K, at the longest fixture context not above the case's; 16K for 32K / 64K, which
``acceptance_context`` says) over the iteration measured on the 8B shape, against our K = 0 step of the same run.
A projection from two measurements, not an end-to-end speedup. Acceptance records are tried in the order of
``--acceptance-records`` (least-squares scales first, the copies' default; then absmax), and each record names the
one it used (``acceptance_record``). The issue's targets are written beside the cases they name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records

#: bench_long strategy -> (acceptance strategy, draft weights)
STRATEGIES = {
    "vegas": ("vegas", "bf16"),
    "vegas_int8": ("vegas", "int8"),
    "vegas_int4": ("vegas", "int4"),
    "low_bit_int8": ("draft_model", "int8"),
    "low_bit_int4": ("draft_model", "int4"),
}
#: acceptance records, first found first used: Vegas' and the low_bit strategy's, least-squares scales before absmax
RECORDS = {
    "vegas": ["cpu:128:vegas:mse", "cpu:128:vegas:mse:1k", "cpu:128:vegas"],
    "draft_model": ["cpu:128:mse", "cpu:128:mse:short", "cpu:128"],
}
#: issue 39's targets: (strategy, batch, context) -> projected speedup over K = 0
TARGETS = {
    ("vegas_int4", 1, 16384): 2.0, ("low_bit_int4", 1, 4096): 2.0, ("vegas_int8", 1, 16384): 1.5,
    ("vegas_int4", 4, 65536): 1.8, ("vegas_int8", 4, 65536): 1.8, ("vegas", 4, 65536): 1.8,
    ("vegas_int4", 16, 16384): 1.9, ("vegas_int8", 16, 16384): 1.9, ("vegas", 16, 16384): 1.9,
}  # fmt: skip


def acceptance_table(path: Path) -> dict:
    """``(strategy, weights, context, k) -> (tokens per step, record)`` from the first record of `RECORDS` holding
    each cell (the fixture's unrounded draft, "full", is the bf16 one)."""
    records = {r["setting"]: r for r in _records.records(path)}
    table = {}
    for strategy, settings in RECORDS.items():
        for setting in settings:
            for row in records.get(setting, {}).get("rows", []):
                weights = "bf16" if row["draft_weights"] == "full" else row["draft_weights"]
                key = (strategy, weights, row["context"], row["k"])
                table.setdefault(key, (row["mean_acceptance_length"], setting))
    return table


def project(speed_files: list[Path], acceptance: dict) -> tuple[list[dict], list[dict]]:
    records, sources = [], []
    for path in speed_files:
        data = json.loads(path.read_text())
        machine = data["machine"]
        sources.append(dict(file=path.name, gpu=machine["gpu"], commit=machine["commit"], date=machine["date"]))
        k0 = {(r["batch"], r["context"]): r["iteration_ms"] for r in data["records"] if r["strategy"] == "k0"}
        for r in data["records"]:
            out = dict(r, run=path.name, gpu=machine["gpu"], commit=machine["commit"])
            out["k0_step_ms"] = k0.get((r["batch"], r["context"]))
            if r["strategy"] in STRATEGIES and out["k0_step_ms"]:
                strategy, weights = STRATEGIES[r["strategy"]]
                if r.get("asked_draft_weights"):  # more rows than the copy is faster for: drafted on bf16
                    weights = r["draft_weights"]
                contexts = sorted({c for s, w, c, k in acceptance if (s, w, k) == (strategy, weights, r["k"])})
                at = max((c for c in contexts if c <= r["context"]), default=None)
                if at is not None:
                    length, setting = acceptance[(strategy, weights, at, r["k"])]
                    out.update(acceptance_length=length, acceptance_context=at, acceptance_record=setting)
                    out["projected_speedup"] = length * out["k0_step_ms"] / r["iteration_ms"]
            target = TARGETS.get((r["strategy"], r["batch"], r["context"]))
            if target is not None:
                out["target"] = target
                projected = out.get("projected_speedup")
                out["target_met"] = None if projected is None else projected >= target  # None: not projected
            records.append(out)
    return records, sources


def plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in records if r.get("projected_speedup") is not None]
    if not shown:
        print(f"nothing projected (no acceptance record matches): {path.name} not drawn")
        return
    cases = sorted({(r["batch"], r["context"]) for r in shown}, key=lambda c: (c[0], c[1]))
    names = [s for s in STRATEGIES if any(r["strategy"] == s for r in shown)]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        for x, case in enumerate(cases):
            # a case run twice: its latest run (the files in the order given)
            found = [r for r in shown if (r["batch"], r["context"]) == case and r["strategy"] == name]
            if not found:
                continue
            r = found[-1]
            ax.bar(x + i * width, r["projected_speedup"], width, color=f"C{i}", label=name if x == 0 else None)
            if r.get("asked_draft_weights"):  # drafted on the model's own weights
                ax.text(x + i * width, r["projected_speedup"], "bf16", ha="center", va="bottom", fontsize=6)
            if r.get("target"):
                ax.plot([x + i * width - width / 2, x + i * width + width / 2], [r["target"]] * 2, "k--", lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(cases))], [f"{b} x {c // 1024}K" for b, c in cases])
    ax.set_ylabel("projected speedup over our K = 0 (K = 6)")
    ax.set_title(title + " (dashed: issue 39 targets)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("speed", nargs="+", type=Path, help="bench_long.py speed outputs (one device run each)")
    parser.add_argument("--acceptance", type=Path, default=_records.results_path("low_bit_acceptance"))
    parser.add_argument("--setting", required=True, help="the record's name, e.g. h100:<commit>")
    parser.add_argument("--description", default="", help="how the speed parts were run (command, machine)")
    parser.add_argument("--out", type=Path, default=_records.results_path("long_low_bit"))
    args = parser.parse_args()
    records, sources = project(args.speed, acceptance_table(args.acceptance))
    machine = json.loads(args.speed[0].read_text())["machine"]
    record = dict(setting=args.setting, description=args.description, machine=machine, sources=sources,
                  note=__doc__.split("\n\n")[2].replace("\n", " "), records=records)  # fmt: skip
    _records.add(args.out, record, benchmark="long_low_bit")
    png = args.out.with_name(f"{args.out.stem}_{args.setting.replace(':', '_')}.png")
    commits = ", ".join(dict.fromkeys(source["commit"][:7] for source in sources))
    plot(records, png, f"Llama-3.1-8B shape, {machine['gpu']}, commits {commits}")
    for r in records:
        if r.get("projected_speedup") is not None or r["strategy"] == "k0":
            projected = r.get("projected_speedup")
            print(
                f"{r['batch']:>3} x {r['context']:>6} {r['strategy']:<14} draft {r['draft_ms'] / max(r['k'], 1):6.2f}"
                f" ms/step  iteration {r['iteration_ms']:6.2f}  acceptance {r.get('acceptance_length') or 0:5.2f}"
                f"  projected {projected or 0:5.2f}  target {r.get('target', '-')}"
            )
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
