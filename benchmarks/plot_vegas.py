"""Draw bench_vegas.py JSONs: PNGs next to each JSON.

- ``<stem>_positions.png``: acceptance probability vs draft position per strategy, one panel per context length, at
  the largest K measured (the Vegas paper's Fig. 4 in our setting);
- ``<stem>_acceptance.png``: mean acceptance length vs context per strategy, one panel per K;
- ``<stem>_speed.png``: decode tokens/s per case, one panel per (model, context), with the per-step split
  (draft / verify / other) of the speculative cases beside it.

    python benchmarks/plot_vegas.py benchmarks/results/vegas.json --setting all
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

COLORS = {
    "vegas": "#2b6cb0",
    "vegas_all": "#63b3ed",
    "vegas_last_token": "#dd6b20",
    "streaming": "#718096",
    "quest": "#38a169",
}
LABELS = {
    "vegas": "vegas (first + bonus rows)",
    "vegas_all": "vegas, all rows (Eq. 2)",
    "vegas_last_token": "last accepted token",
    "streaming": "streaming",
    "quest": "quest",
}


def _subtitle(result: dict) -> str:
    machine = result["machine"]
    return f"{machine.get('gpu') or machine['cpu']}, torch {machine['torch']}, {result['dtype']}"


def plot_positions(result: dict, out: Path) -> Path:
    records = result["acceptance"]
    k_max = max(r["k"] for r in records)
    lengths = sorted({r["prompt_len_class"] for r in records})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.2 * len(lengths), 3.8), squeeze=False, sharey=True)
    low = 1.0
    for ax, length in zip(axes[0], lengths):
        for r in records:
            if r["prompt_len_class"] != length or r["k"] != k_max:
                continue
            rates = r["acceptance_per_position"]
            low = min([low, *rates])
            name = r["strategy"]
            ax.plot(
                range(1, len(rates) + 1),
                rates,
                "o-",
                color=COLORS.get(name),
                label=f"{LABELS.get(name, name)} ({r['mean_acceptance_length']:.2f})",
            )
        first = next(r for r in records if r["prompt_len_class"] == length)
        ax.set_title(
            f"{length} tokens, budget {first['budget_tokens_at_start']} ({first['prompts']} prompts)",
            fontsize=9,
        )
        ax.set_xlabel("draft position")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="strategy (mean acc. length)", title_fontsize=7)
    axes[0][0].set_ylabel("acceptance probability\n(accepted / reached)")
    axes[0][0].set_ylim(max(0.0, low - 0.05), 1.02)
    first = records[0]
    fig.suptitle(
        f"code-target, K={k_max}, ratio {first['ratio']}, min_tokens {first['min_tokens']}, greedy; "
        + _subtitle(result),
        fontsize=9,
    )
    fig.tight_layout()
    path = out.with_name(out.stem + "_positions.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_acceptance(result: dict, out: Path) -> Path:
    records = result["acceptance"]
    ks = sorted({r["k"] for r in records})
    fig, axes = plt.subplots(1, len(ks), figsize=(max(7.0, 4.2 * len(ks)), 3.8), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], ks):
        for name in dict.fromkeys(r["strategy"] for r in records):
            rs = sorted(
                (r for r in records if r["strategy"] == name and r["k"] == k),
                key=lambda r: r["prompt_len_class"],
            )
            ax.plot(
                [r["prompt_len_class"] for r in rs],
                [r["mean_acceptance_length"] for r in rs],
                "o-",
                color=COLORS.get(name),
                label=LABELS.get(name, name),
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["prompt_len_class"] for r in records}))
        ax.get_xaxis().set_major_formatter(FuncFormatter(lambda x, _: f"{int(x) // 1024}K"))
        ax.set_title(f"K = {k}", fontsize=10)
        ax.set_xlabel("context (prompt tokens)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean acceptance length")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("code-target, mean acceptance length vs context; " + _subtitle(result), fontsize=9)
    fig.tight_layout()
    path = out.with_name(out.stem + "_acceptance.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speed(result: dict, out: Path) -> Path:
    rows = result["speed_summary"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["context"]), []).append(r)
    fig, axes = plt.subplots(2, len(groups), figsize=(4.4 * len(groups), 7), squeeze=False)
    for col, ((model, context), rs) in enumerate(groups.items()):
        ax = axes[0][col]
        names = [r["case"] for r in rs]
        values = [r["decode_tokens_per_s"] for r in rs]
        colors = ["#888" if n == "plain_generate" else COLORS.get(n.split("_k")[0], "#2b6cb0") for n in names]
        ax.bar(range(len(names)), values, color=colors)
        for i, r in enumerate(rs):
            label = f"{r.get('decode_ratio_to_plain', 1.0):.2f}x"
            if "mean_acceptance_length" in r and r["case"] != "k0_plain_policy":
                label += f"\nMAL {r['mean_acceptance_length']:.2f}"
            ax.text(i, values[i], label, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        random = " (random weights)" if rs[0].get("note") else ""
        ax.set_title(f"{model}{random}\ncontext {context}", fontsize=9)
        ax.set_ylabel("decode tokens/s (median)")
        ax.margins(y=0.2)

        ax = axes[1][col]
        spec = [r for r in rs if "draft_ms_per_step" in r]
        bottom = [0.0] * len(spec)
        for part, color in (("draft", "#90cdf4"), ("verify", "#2c5282"), ("other", "#fbd38d")):
            vals = [max(0.0, r[f"{part}_ms_per_step"]) for r in spec]
            ax.bar(range(len(spec)), vals, bottom=bottom, color=color, label=part)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, r in enumerate(spec):
            if "overhead_vs_streaming" in r:
                ax.text(
                    i,
                    bottom[i],
                    f"{100 * r['overhead_vs_streaming']:+.1f}%\nvs streaming",
                    ha="center",
                    fontsize=7,
                )
        ax.set_xticks(range(len(spec)), [r["case"] for r in spec], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("ms per step (median)")
        ax.margins(y=0.25)
        ax.legend(fontsize=7)
    fig.suptitle("decode tokens/s side by side; per-step time split; " + _subtitle(result), fontsize=9)
    fig.tight_layout()
    path = out.with_name(out.stem + "_speed.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> list[str]:
    written = []
    out, result = _records.plot_input(__doc__)
    if result.get("acceptance"):
        written += [plot_positions(result, out), plot_acceptance(result, out)]
    if result.get("speed_summary"):
        written.append(plot_speed(result, out))
    return [str(p) for p in written]


if __name__ == "__main__":
    print("\n".join(main()))
