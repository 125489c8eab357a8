"""Draw a bench_generate.py JSON as a bar chart of tokens/s (plain generate vs each case, per model/context).

python benchmarks/plot_generate.py benchmarks/results/generate.json --setting all
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> str:
    path, result = _records.plot_input(__doc__)
    groups: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in result["records"]:
        if "tokens_per_s" not in r:
            continue
        key = (r["model"], r.get("prompt_len_class", r["context"]))
        groups[key][r["case"]].append(r["tokens_per_s"])
        groups[key]["plain generate"].append(r["plain_tokens_per_s"])
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4), squeeze=False)
    for ax, ((model, ctx), cases) in zip(axes[0], groups.items()):
        names = ["plain generate"] + [c for c in cases if c != "plain generate"]
        values = [statistics.median(cases[n]) for n in names]
        ax.bar(range(len(names)), values, color=["#888"] + ["#2b6cb0"] * (len(names) - 1))
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{model}\ncontext {ctx}", fontsize=9)
        ax.set_ylabel("tokens/s (median)")
    machine = result["machine"]
    fig.suptitle(
        f"{machine.get('gpu') or machine['cpu']}, torch {machine['torch']}, {result['dtype']}", fontsize=9
    )
    fig.tight_layout()
    out = str(Path(path).with_suffix(".png"))
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main())
