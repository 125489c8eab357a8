"""Where a `generate` call's time goes, per K policy, on one prompt: wall time against the sum of the step times the
loop measures (CUDA events), the prefill, and the rest (host work between steps, setup, teardown).

Why: in `bench_cascade.py --suite e2e` (`results/h200_cascade_e2e_s14.json`) the ``utility`` policy made exactly
static K = 8's choices on some workloads (same tokens per step, same acceptance) and still took ~2.7% longer per call.
Configurations are timed interleaved (A B C D, repeated), each after its own warm-up calls.

``python benchmarks/diag_policy_overhead.py --shared .carry/shared --json out.json``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv
from benchmarks.bench_cascade import FULL, workloads
from hf_sparse_verify.drivers.machine import machine_info

CONFIGS = {
    "static_k8": dict(strategy="prompt_lookup", num_draft_tokens=8),  # as bench_cascade (max_draft_tokens 16)
    "static_k8_max8": dict(strategy="prompt_lookup", num_draft_tokens=8, max_draft_tokens=8),
    "utility": dict(strategy="prompt_lookup", k_policy="utility", max_draft_tokens=8),  # as bench_cascade
    "utility_max16": dict(strategy="prompt_lookup", k_policy="utility", max_draft_tokens=16),
}


def one_call(model, ids, spec, new_tokens):
    torch.cuda.synchronize()
    begin = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
        custom_generate=hsv.generate, speculation=spec, return_dict_in_generate=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    wall = time.perf_counter() - begin
    stats = out.speculation
    steps_s = sum(stats.step_times_s)
    return dict(
        wall_ms=1e3 * wall,
        loop_wall_ms=1e3 * stats.wall_time_s,
        prefill_ms=1e3 * stats.prefill_time_s,
        steps_ms=1e3 * steps_s,
        steps=stats.steps,
        mean_k=sum(stats.draft_tokens) / max(1, stats.steps),
        untimed_loop_ms=1e3 * (stats.wall_time_s - stats.prefill_time_s - steps_s),
        outside_loop_ms=1e3 * (wall - stats.wall_time_s),
    )


def fixture_prompt(shared: Path, name: str):
    """The fixture ``name`` (bf16, CUDA) and the first ``good`` prompt of `bench_cascade`'s e2e runs (length class
    2048, cut to 1024 tokens), with those runs' sizes."""
    sizes = dataclasses.replace(FULL, prompt_len_class=2048)
    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    model = AutoModelForCausalLM.from_pretrained(shared / name, dtype=torch.bfloat16).to("cuda").eval()
    ids = workloads(shared, tok, sizes, model.config.vocab_size)["good"][0].to("cuda")
    return model, ids, sizes


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--models", nargs="+", default=["code-moe", "code-target"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()
    shared = Path(args.shared) / "models"
    results = []
    for name in args.models:
        model, ids, sizes = fixture_prompt(shared, name)
        for spec in CONFIGS.values():
            for _ in range(2):
                one_call(model, ids, spec, sizes.new_tokens)
        runs = {c: [] for c in CONFIGS}
        for _ in range(args.rounds):
            for config, spec in CONFIGS.items():
                runs[config].append(one_call(model, ids, spec, sizes.new_tokens))
        for config, calls in runs.items():
            row = {k: round(statistics.median(c[k] for c in calls), 4) for k in calls[0]}
            results.append(dict(model=name, config=config, **row))
            print(name, f"{config:>16}", " ".join(f"{k} {v}" for k, v in row.items()))
        del model
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine_info(torch.device("cuda")), method=__doc__.split("\n\n")[1],
                           records=results), f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
