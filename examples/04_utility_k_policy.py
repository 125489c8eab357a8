"""The utility K policy (Cascade) picks K per step from measured speed-ups; plot its trace.

``k_policy="utility"`` times a few plain decode steps, then tries several K for a few steps each and keeps
the K with the best *utility* (tokens per step / relative step time); it switches speculation off (K = 0)
when no K pays. ``output.speculation`` records K, accepted tokens and the policy's phase at every step.

    python examples/04_utility_k_policy.py [--out FOLDER] [--max-new-tokens N]

The plot goes to ``--out`` (created if missing; default: a new temporary folder); the path is printed.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import matplotlib
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv

matplotlib.use("Agg")  # files only, no window
import matplotlib.pyplot as plt  # noqa: E402

PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"
PHASE_COLORS = {"baseline": "#d9d9d9", "test": "#fde2b8", "set": "#d4ecd4"}


def plot_trace(stats: hsv.SpeculationStats, path: str) -> str:
    """K per step and tokens emitted per step (row 0), phases of the policy shaded; returns ``path``."""
    steps = range(len(stats.draft_tokens))
    emitted = [1 + (rows[0] or 0) for rows in stats.accepted_tokens]
    fig, ax = plt.subplots(figsize=(8, 3))
    for i, state in enumerate(stats.policy_states):
        ax.axvspan(i - 0.5, i + 0.5, color=PHASE_COLORS.get(state.get("phase"), "white"), lw=0)
    ax.step(steps, stats.draft_tokens, where="mid", label="K (draft tokens)")
    ax.plot(steps, emitted, "o", ms=3, label="tokens emitted")
    ax.set_ylim(-0.5, max(stats.draft_tokens + emitted) + 2)  # room for the legend
    ax.set_xlabel("step")
    ax.set_title("utility K policy: baseline (grey), test (orange), set (green)")
    ax.legend(loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument("--draft-model", default=os.path.join(hsv.default_model_path(), "draft"))
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", help="folder for utility_trace.png (default: a new temporary folder)")
    args = parser.parse_args(argv)
    out_dir = args.out or tempfile.mkdtemp(prefix="hsv_example_")
    os.makedirs(out_dir, exist_ok=True)  # --out plots/ may not exist yet

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    target = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")

    out = target.generate(
        **inputs,
        custom_generate=hsv.generate,
        draft_model=draft,
        speculation=hsv.SpeculationConfig(strategy="draft_model", k_policy="utility", max_draft_tokens=8),
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    stats = out.speculation
    print("K per step:", stats.draft_tokens)
    print("phases:    ", [state["phase"] for state in stats.policy_states])
    print(stats.summary())
    print("plot:", plot_trace(stats, os.path.join(out_dir, "utility_trace.png")))


if __name__ == "__main__":
    main()
