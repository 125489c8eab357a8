"""Draw ``bench step`` and ``bench_kernels.py`` results: step time vs new tokens (ours, transformers eager, floor)
per context, and the decode-attention kernel's share of the copy bandwidth.

``python benchmarks/plot_step.py benchmarks/results/step.json --setting 8b``, ``python benchmarks/plot_step.py benchmarks/results/kernels.json``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import matplotlib

from benchmarks import _records  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_steps(path: Path, result: dict) -> Path:
    contexts = sorted({r["context"] for r in result["records"]})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts), 4), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        rows = [r for r in result["records"] if r["context"] == context and r["batch"] == 1]
        new = [r["new_tokens"] for r in rows]
        ax.plot(new, [r["ours_ms"] for r in rows], "o-", label="ours (CUDA graph + Triton)")
        if any(r.get("ours_vegas_scores_ms") for r in rows):
            ax.plot(new, [r.get("ours_vegas_scores_ms") for r in rows], "s--", label="ours + Vegas scores")
        ax.plot(new, [r["transformers_ms"] for r in rows], "^-", label="transformers eager (SDPA)")
        ax.plot(new, [r["floor_ms"] for r in rows], "k:", label="bandwidth floor")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("new tokens per step (K + 1)")
        ax.set_ylabel("ms per forward step")
        ax.set_title(f"{result['shape']}, context {context}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{result['machine']['gpu']}, {result['dtype']}, commit {result['machine']['commit'][:7]}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def plot_kernels(path: Path, result: dict) -> Path:
    rows = [r for r in result["records"] if r["op"] == "decode_attention" and "share_of_copy" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant, style in (("triton", "o-"), ("triton+scores", "s--"), ("sdpa", "^:")):
        for context in sorted({r["context"] for r in rows}):
            sel = [r for r in rows if r["variant"] == variant and r["context"] == context]
            ax.plot(
                [r["q_len"] for r in sel],
                [r["share_of_copy"] for r in sel],
                style,
                label=f"{variant} {context}",
            )
    ax.axhline(0.7, color="k", lw=0.8, ls=":", label="target 70%")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("query tokens per row")
    ax.set_ylabel("bytes moved / time, share of copy bandwidth")
    ax.set_title("decode attention, Llama-3.1-8B heads, batch 1")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = path.with_name(path.stem + "_attention.png")
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    path, result = _records.plot_input(__doc__)
    if result["records"] and "op" in result["records"][0]:  # a bench_kernels.py record: <file>_attention.png
        print(plot_kernels(path, result))
    else:  # a bench step record: <file>_<setting>.png
        print(plot_steps(path.with_name(f"{path.stem}_{result.get('setting', 'step')}.json"), result))


if __name__ == "__main__":
    main()
