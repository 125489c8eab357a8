"""Draw ``results/multigpu.json`` (bench_multigpu.py): per placement (path and GPU count), our K = 0 step against our
single-GPU step and the floor (left), and whole calls against plain ``generate`` under the same placement (right).

Left panel: x groups = placements (``device_map 2``, ``tensor_parallel 4``, ...), bars = our K = 0 step over
several GPUs, our single-GPU K = 0 step on the same machine, the floor (ms, lower is better). Right panel: same
groups, one bar per strategy, y = decode tokens/s over plain ``generate``'s. Only records of the given shape, batch
and context, and per placement the latest commit.

    python benchmarks/plot_multigpu.py [--results benchmarks/results/multigpu.json] [--out multigpu.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STRATEGIES = ("k0", "prompt_lookup", "vegas", "auto")


def latest(records: list[dict], shape: str, batch: int, context: int) -> dict[tuple, list[dict]]:
    """Per (path, gpus, device): the records of the latest commit measured there (by the machine's date)."""
    chosen: dict[tuple, list[dict]] = {}
    for r in records:
        if (r.get("shape"), r.get("batch"), r.get("context")) != (shape, batch, context) or "error" in r:
            continue
        key = (r["path"], r["gpus"], r["device"])
        date = (r.get("machine") or {}).get("date", "")
        if key not in chosen or date > chosen[key][0]:
            chosen[key] = (date, r.get("commit"), [])
        if chosen[key][1] == r.get("commit"):
            chosen[key][2].append(r)
    return {key: rows for key, (_, _, rows) in sorted(chosen.items())}


def draw(results: Path, out: Path, shape: str, batch: int, context: int) -> None:
    groups = latest(json.loads(results.read_text())["records"], shape, batch, context)
    if not groups:
        raise SystemExit(f"no records of {shape}, batch {batch}, context {context} in {results}")
    labels = [f"{path.replace('_', ' ')}\n{gpus} x {device}" for path, gpus, device in groups]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.26
    for i, rows in enumerate(groups.values()):
        r = rows[0]
        for j, (field, name, color) in enumerate(
            (("step_ms", "ours, several GPUs", "tab:blue"), ("single_gpu_step_ms", "ours, one GPU", "tab:gray"),
             ("floor_ms", "floor", "tab:green"))
        ):  # fmt: skip
            value = r.get(field)
            if value:
                left.bar(i + (j - 1) * width, value, width, color=color, label=name if i == 0 else None)
                left.text(i + (j - 1) * width, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    left.set_xticks(range(len(labels)), labels, fontsize=8)
    left.set_ylabel("K = 0 step, ms (lower is better)")
    left.set_title(f"{shape}, batch {batch}, context {context}: one decode step")
    left.legend(fontsize=8)
    width = 0.8 / len(STRATEGIES)
    labelled = set()
    for i, rows in enumerate(groups.values()):
        by = {r["strategy"]: r for r in rows}
        for j, strategy in enumerate(STRATEGIES):
            r = by.get(strategy)
            if r is None or not r.get("vs_plain"):
                continue
            x = i + (j - (len(STRATEGIES) - 1) / 2) * width
            right.bar(x, r["vs_plain"], width, color=f"C{j}", label=None if strategy in labelled else strategy)
            labelled.add(strategy)
            right.text(x, r["vs_plain"], f"{r['vs_plain']:.1f}", ha="center", va="bottom", fontsize=7)
    right.axhline(1.0, color="black", lw=0.8)
    right.set_xticks(range(len(labels)), labels, fontsize=8)
    right.set_ylabel("decode tokens/s over plain generate, same placement")
    right.set_title("whole generate calls (random weights: nothing accepted)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent / "results"
    parser.add_argument("--results", type=Path, default=here / "multigpu.json")
    parser.add_argument("--out", type=Path, default=here / "multigpu.png")
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()
    draw(args.results, args.out, args.shape, args.batch, args.context)


if __name__ == "__main__":
    main()
