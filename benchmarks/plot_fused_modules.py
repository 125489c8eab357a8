"""Draw a ``bench_fused_modules.py`` JSON: step time of each variant per shape and new-token count, as grouped bars
with the bandwidth floor as a line per group.

``python benchmarks/plot_fused_modules.py benchmarks/results/fused_modules.json --setting ab_s12``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(path: Path, result: dict) -> Path:
    records = result["records"]
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = [r for r in records if r["shape"] == shape]
        widths = sorted({r["new_tokens"] for r in rows})
        bar = 0.8 / len(variants)
        for i, variant in enumerate(variants):
            ms = [
                next(r["ms"] for r in rows if r["new_tokens"] == w and r["variant"] == variant)
                for w in widths
            ]
            ax.bar([x + i * bar for x in range(len(widths))], ms, bar, label=variant)
        for x, w in enumerate(widths):
            floor = next(r["floor_ms"] for r in rows if r["new_tokens"] == w)
            ax.hlines(floor, x - bar / 2, x + 0.8 - bar / 2, colors="black", linestyles="dashed")
        ax.set_xticks([x + 0.4 - bar / 2 for x in range(len(widths))], [str(w) for w in widths])
        ax.set_xlabel("new tokens per step (dashed: bandwidth floor)")
        ax.set_ylabel("ms per captured step")
        ax.set_title(f"{shape}, {rows[0]['context']} context")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{result['machine'].get('gpu', '')}, commit {result['machine'].get('commit', '')}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(plot(*_records.plot_input(__doc__)))
