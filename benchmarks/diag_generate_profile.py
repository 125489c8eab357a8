"""Where the GPU time of whole self-speculation calls goes, strategy against strategy: torch.profiler over a warm
`generate` call (graphs already captured by a first call), CUDA kernels grouped by name, per step.

Llama-3.1-8B shape, random bf16 weights, the `bench_long.py` settings (ratio 0.07, min_tokens 256). Random weights
accept almost nothing, so every step drafts K tokens and verifies K + 1: the per-step kernel table is the cost of
one full iteration (a long call's kernel times minus a short call's, over the difference in steps, so the prefill
cancels). Writes the top kernels of every strategy and their difference.

    python benchmarks/diag_generate_profile.py --batch 4 --context 65536 --k 6 --strategies vegas streaming \\
        --json benchmarks/results/h200_profile_4x64k_vegas_streaming.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_long import _generate, _speculation
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.shapes import random_model


def kernel_totals(prof) -> dict[str, float]:
    """Microseconds of every CUDA kernel name, summed over the profiled call."""
    table: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            table[event.name] += event.device_time
    return dict(table)


def profiled(model, ids, new_tokens: int, speculation: dict):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        stats = _generate(model, ids, new_tokens, speculation)
        torch.cuda.synchronize()
    return stats, kernel_totals(prof)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--strategies", nargs="+", default=["vegas", "streaming"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = random_model("llama-3.1-8b", device, torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.context), device=device)
    result = dict(machine=machine_info(device), args=vars(args), strategies={})
    for strategy in args.strategies:
        speculation = _speculation(strategy, args.k)
        _generate(model, ids, args.new_tokens, speculation)  # captures the graphs
        # a short and a long call: both pay the same prefill, so their difference is the steps alone
        short, short_us = profiled(model, ids, args.k + 2, speculation)
        stats, long_us = profiled(model, ids, args.new_tokens, speculation)
        steps = max(1, stats.steps - short.steps)
        table = {
            n: (long_us.get(n, 0.0) - short_us.get(n, 0.0)) / steps for n in set(long_us) | set(short_us)
        }
        top = sorted(table.items(), key=lambda kv: -kv[1])[: args.top]
        parts = [sum(p[i] for p in stats.step_parts_s) * 1000 / max(1, stats.steps) for i in range(3)]
        result["strategies"][strategy] = dict(
            steps=steps,
            draft_ms=parts[0],
            verify_ms=parts[1],
            update_ms=parts[2],
            prefill_s=stats.prefill_time_s,
            kernel_us_per_step_total=sum(table.values()),
            top_kernels_us_per_step=top,
            kernels=table,
        )
        print(
            f"== {strategy}: {steps} steps, draft {parts[0]:.2f} verify {parts[1]:.2f} update {parts[2]:.2f} ms"
        )
        for name, us in top:
            print(f"  {us:10.1f} us  {name[:110]}")
    if len(args.strategies) == 2:
        a, b = (result["strategies"][s]["kernels"] for s in args.strategies)
        diff = {n: a.get(n, 0.0) - b.get(n, 0.0) for n in set(a) | set(b)}
        result["difference_us_per_step"] = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: args.top]
        print(f"== {args.strategies[0]} minus {args.strategies[1]} (us per step)")
        for name, us in result["difference_us_per_step"]:
            print(f"  {us:+10.1f}  {name[:110]}")
    for s in result["strategies"].values():
        s.pop("kernels")
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
