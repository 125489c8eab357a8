"""Draw a bench_cascade.py JSON: PNGs next to it.

- ``<stem>_steps.png``: verify step time vs K for each MoE model, ours and plain transformers, normalised to
  K = 0, with the unique experts touched per layer on a second axis;
- ``<stem>_e2e.png``: tokens/s per configuration per workload (grouped bars), one panel per fixture;
- ``<stem>_trace.png``: the ``utility`` policy over one request (like Cascade's Fig. 15): K per step and the
  measured utility per step over time, phases shaded.

    python benchmarks/plot_cascade.py benchmarks/results/cascade.json --setting e2e
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASE_COLORS = {"baseline": "#d9d9d9", "test": "#fde2b8", "set": "#d4ecd4"}
WORKLOADS = ("good", "poor", "random", "mix")


def _subtitle(result: dict) -> str:
    machine = result["machine"]
    return f"{machine.get('gpu') or machine['cpu']}, torch {machine['torch']}, {result['dtype']}"


def plot_steps(result: dict, out: Path) -> Path:
    steps = result["steps"]
    models = list(dict.fromkeys(r["model"] for r in steps))
    fig, axes = plt.subplots(1, len(models), figsize=(5.2 * len(models), 3.9), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = sorted((r for r in steps if r["model"] == model), key=lambda r: r["k"])
        ks = [r["k"] for r in rows]
        experts_ax = ax.twinx()
        experts = [r["unique_experts_per_layer"] or 0 for r in rows]
        experts_ax.bar(ks, experts, color="#cfd8e3", width=0.6, zorder=0, label="unique experts / layer")
        experts_ax.set_ylabel("unique experts per layer per step", color="#5a6b80")
        experts_ax.set_ylim(0, (rows[0].get("num_experts") or max(experts) or 1) * 1.05)
        ax.set_zorder(experts_ax.get_zorder() + 1)
        ax.patch.set_visible(False)
        base = rows[0]
        ax.plot(
            ks,
            [r["ours_ratio_to_k0"] for r in rows],
            "o-",
            color="#2b6cb0",
            label=f"ours ({base['ours_ms']:.1f} ms)",
        )
        ax.plot(
            ks,
            [r["transformers_ratio_to_k0"] for r in rows],
            "s--",
            color="#c05621",
            label=f"transformers ({base['transformers_ms']:.1f} ms)",
        )
        ax.axhline(1.0, color="#888", lw=0.8)
        ax.set_xlabel("K (draft tokens; the forward has K + 1 tokens)")
        ax.set_ylabel("step time / step time at K = 0")
        ax.set_xticks(ks)
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"{model}\n{base.get('num_experts')} experts, top-{base.get('top_k')}, context {base['context']}",
            fontsize=9,
        )
        handles = ax.get_legend_handles_labels()[0] + experts_ax.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="upper left", title="K = 0 time in ()", title_fontsize=7)
    fig.suptitle(f"verify step time vs K, batch 1 -- {_subtitle(result)}", fontsize=9)
    fig.tight_layout()
    path = out.with_name(out.stem + "_steps.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_e2e(result: dict, out: Path) -> Path:
    rows = result["e2e"]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 4.2), squeeze=False)
    by = {(r["model"], r["workload"], r["config"]): r for r in rows}
    for ax, model in zip(axes[0], models):
        configs = list(dict.fromkeys(r["config"] for r in rows if r["model"] == model))
        width = 0.8 / len(configs)
        cmap = plt.get_cmap("Blues")
        for i, config in enumerate(configs):
            if config == "plain_generate":
                color = "#888"
            elif config == "k0_ours":
                color = "#bbb"
            elif config == "utility":
                color = "#d53e4f"
            else:
                color = cmap(0.35 + 0.6 * i / len(configs))
            xs = [w + (i - (len(configs) - 1) / 2) * width for w in range(len(WORKLOADS))]
            values = [by[(model, wl, config)]["tokens_per_s"] for wl in WORKLOADS]
            ax.bar(xs, values, width=width, color=color, label=config, edgecolor="white", lw=0.3)
            if config == "utility":
                for x, wl, v in zip(xs, WORKLOADS, values):
                    ratio = by[(model, wl, config)]["ratio_to_plain"]
                    ax.text(x, v, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=6.5, color="#d53e4f")
        ax.set_xticks(range(len(WORKLOADS)), WORKLOADS)
        ax.set_ylabel("tokens/s (total tokens / total seconds)")
        ax.set_title(f"{model} (utility bars labelled with the ratio to plain generate)", fontsize=9)
    sizes = result.get("sizes", {})
    fig.suptitle(
        f"greedy, batch 1, {sizes.get('context')}-token prompts, {sizes.get('new_tokens')} new tokens, "
        f"prompt_lookup drafts -- {_subtitle(result)}",
        fontsize=9,
    )
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7.5, ncol=len(labels), loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = out.with_name(out.stem + "_e2e.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _shade_phases(ax, times_ms: list[float], phases: list[str]) -> None:
    start = 0
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            left = times_ms[start - 1] if start else 0.0
            ax.axvspan(left, times_ms[i - 1], color=PHASE_COLORS.get(phases[start], "white"), lw=0, zorder=0)
            start = i


def _segments(t: dict) -> list[tuple[int, int]]:
    """``[first, last)`` step ranges of constant (phase, issued K)."""
    keys = list(zip(t["phase"], t["issued_k"]))
    bounds = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    return list(zip(bounds[:-1], bounds[1:]))


def _segment_utilities(t: dict) -> list[tuple[int, int, float, str]]:
    """(first, last, utility, source) per speculating segment: a test trial's utility as the policy measured it
    (reported from the step after the trial), else (set phases) sum(ETR) * t0 / sum(step time) over the segment,
    with t0 the plain step time of the trace's per-step utilities."""
    out = []
    for first, last in _segments(t):
        if t["issued_k"][first] == 0:
            continue
        if (
            t["phase"][first] == "test"
            and last < len(t["trial_utility"])
            and t["trial_utility"][last] is not None
        ):
            out.append((first, last, t["trial_utility"][last], "trial"))
            continue
        steps = [i for i in range(first, last) if t["step_utility"][i] is not None]
        if steps:  # step_utility = ETR * t0 / time  =>  t0 = step_utility * time / ETR
            etr = [1 + (t["accepted"][i] or 0) for i in steps]
            times = [t["step_times_s"][i] for i in steps]
            t0 = [t["step_utility"][i] * times[j] / etr[j] for j, i in enumerate(steps)]
            out.append((first, last, sum(etr) * (sum(t0) / len(t0)) / sum(times), "window"))
    return out


def plot_trace(result: dict, out: Path) -> Path:
    traces = result["traces"]
    models = list(dict.fromkeys(t["model"] for t in traces))
    workloads = list(dict.fromkeys(t["workload"] for t in traces))
    fig, axes = plt.subplots(
        len(workloads), len(models), figsize=(6.4 * len(models), 2.5 * len(workloads) + 0.7), squeeze=False
    )
    by = {(t["model"], t["workload"]): t for t in traces}
    legend: dict[str, object] = {}
    for row, workload in enumerate(workloads):
        for col, model in enumerate(models):
            ax = axes[row][col]
            t = by.get((model, workload))
            if t is None:
                ax.axis("off")
                continue
            ends, total = [], 0.0
            for s in t["step_times_s"]:
                total += s * 1000.0
                ends.append(total)
            starts = [0.0] + ends[:-1]
            _shade_phases(ax, ends, t["phase"])
            ax.step(
                starts + ends[-1:],
                t["issued_k"] + t["issued_k"][-1:],
                where="post",
                color="#555",
                lw=1.0,
                label="K issued by the policy",
            )
            ax.plot(
                starts, t["k"], ".", color="#2b6cb0", ms=3, label="K drafted (prompt_lookup may find fewer)"
            )
            ax.set_ylabel("K")
            ax.set_ylim(-0.3, max(max(t["issued_k"]), max(t["k"]), 1) + 0.5)
            uax = ax.twinx()
            pts = [(x, u) for x, u in zip(starts, t["step_utility"]) if u is not None]
            if pts:
                uax.plot(*zip(*pts), "o", color="#d53e4f", ms=2.5, alpha=0.6, label="utility of each step")
            for first, last, u, source in _segment_utilities(t):
                uax.hlines(
                    u,
                    starts[first],
                    ends[last - 1],
                    color="#d53e4f",
                    lw=1.8 if source == "trial" else 1.2,
                    ls="-" if source == "trial" else "--",
                    label="trial utility (policy)" if source == "trial" else "set-phase utility (window)",
                )
            uax.axhline(1.0, color="#d53e4f", lw=0.6, ls=":")
            uax.set_ylabel("utility", color="#d53e4f")
            uax.set_ylim(bottom=0)
            ax.set_title(f"{model}, {workload} prompt", fontsize=9)
            if row == len(workloads) - 1:
                ax.set_xlabel("time in the request (ms, summed step times; prefill excluded)")
            for axis in (ax, uax):
                for h, label in zip(*axis.get_legend_handles_labels()):
                    legend.setdefault(label, h)
    handles = list(legend.values())
    handles += [plt.Rectangle((0, 0), 1, 1, color=c, label=f"{p} phase") for p, c in PHASE_COLORS.items()]
    fig.legend(
        handles=handles,
        labels=list(legend) + [h.get_label() for h in handles[len(legend) :]],
        fontsize=7,
        ncol=4,
        loc="lower center",
        frameon=False,
    )
    fig.suptitle(
        f"utility K policy over one request (utility = ETR / (step time / plain step time)) -- {_subtitle(result)}",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = out.with_name(out.stem + "_trace.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> list[Path]:
    out, result = _records.plot_input(__doc__)
    written = []
    if result.get("steps"):
        written.append(plot_steps(result, out))
    if result.get("e2e"):
        written.append(plot_e2e(result, out))
    if result.get("traces"):
        written.append(plot_trace(result, out))
    return written


if __name__ == "__main__":
    for p in main():
        print(p)
