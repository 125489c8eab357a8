"""Host profile (cProfile) of whole `generate` calls on a fixture model: where a short call's time goes outside the
captured steps (setup, prefill, per-step host work, teardown). Prints the top functions by cumulative and by own
time, and writes the cProfile stats to ``--out`` when given.

``python benchmarks/diag_call_profile.py --shared .carry/shared --model code-moe --calls 20``
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from pathlib import Path

import torch

import hf_sparse_verify as hsv
from benchmarks.diag_policy_overhead import fixture_prompt


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--model", default="code-moe")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--policy", default="utility", choices=["utility", "plain", "constant"])
    parser.add_argument("--out")
    args = parser.parse_args()
    model, ids, sizes = fixture_prompt(Path(args.shared) / "models", args.model)
    spec = dict(strategy="prompt_lookup", k_policy=args.policy, max_draft_tokens=8, num_draft_tokens=8)
    if args.policy == "plain":
        spec = dict(k_policy="plain")

    def call():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=sizes.new_tokens,
                       do_sample=False, custom_generate=hsv.generate, speculation=spec)  # fmt: skip
        torch.cuda.synchronize()

    for _ in range(3):
        call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.calls):
        call()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    if args.out:
        stats.dump_stats(args.out)


if __name__ == "__main__":
    main()
