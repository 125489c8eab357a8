"""Why expert skipping barely shortens the Qwen3-30B-A3B verify step (issue 11, GPU).

In ``results/h200_sparse_verify.json`` the 8-token verify step with ``moe_skip1`` / ``moe_skip2`` / ``moe_skip4``
took 8.56 / 8.13 / 8.58 ms against 8.69 dense, although 4 kept experts per token should leave ~28 distinct experts
per layer of the ~52 a dense step reads. This script separates the experts op from the step:

- ``layer``: one experts layer (Qwen3-30B-A3B sizes, uniformly random routing, 8 tokens), the fused op with every
  token keeping ``n`` of its 8 experts, ``n`` = 8 .. 1: time (CUDA graph of 20 launches), distinct experts kept and
  the bandwidth those bytes imply; a profile of the op's kernels at ``n`` = 8 and 4. Both layouts of
  `kernels/fused_experts` for these 8 tokens: ``experts`` (the default) and ``aligned`` (the align launch).
- ``step``: the random-weight model, 1K context, batch 1, the captured decode step and 8-token verify step dense
  and with each ``moe_skip*`` setting of `benchmarks/bench_sparse_verify.py`: time (median of synchronized calls)
  and the kernels of 10 graph replays grouped by name; both layouts, each with its own runner and graphs.

First run (H200, commit after 7f93994, before the `EXPERTS` layout of `kernels/fused_experts`): the experts op
alone scales with the distinct experts (8 tokens: 143 us at 55 experts, 87 at 29, 58 at 15), while in the step
``_align_kernel`` (one program) took 10 us per layer dense and 14.6 with skipping, 0.49 / 0.70 ms per step.

    python benchmarks/diag_moe_skip.py --json diag_moe_skip.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch
from tqdm import tqdm

from benchmarks.bench_kernels import time_case
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.profile import kernel_rows
from hf_sparse_verify.kernels.fused_experts import bench as fe_bench
from hf_sparse_verify.kernels.fused_experts import fused_experts
from hf_sparse_verify.kernels.fused_experts import kernel as fe_kernel

WIDTH = 8


def _profile(run, steps: int = 10, top: int = 14) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    rows = [dict(r, us_per_step=round(r["us_per_step"], 1)) for r in kernel_rows(prof, steps)]
    return [dict(total_us=round(sum(r["us_per_step"] for r in rows), 1))] + rows[:top]


def _layouts():
    """``(name, EXPERT_GRID_MAX_TOKENS)``: the `EXPERTS` layout at 8 tokens, and the `ALIGNED` one (align launch)."""
    return (("experts", fe_kernel.EXPERT_GRID_MAX_TOKENS), ("aligned", 1))


def layer(device, dtype, bar) -> list[dict]:
    module = fe_bench.experts_module(device, dtype)
    x = torch.randn(WIDTH, fe_bench.HIDDEN, device=device, dtype=dtype)
    index, weights = fe_bench.route(WIDTH, fe_bench.EXPERTS, fe_bench.TOP_K, device, dtype, seed=WIDTH)
    per_expert = (
        module.gate_up_proj[0].numel() + module.down_proj[0].numel()
    ) * module.gate_up_proj.element_size()
    records = []
    default = fe_kernel.EXPERT_GRID_MAX_TOKENS
    for n in range(fe_bench.TOP_K, 0, -1):
        n_active = torch.full((WIDTH,), n, dtype=torch.int32, device=device)
        run = functools.partial(
            fused_experts, x, module.gate_up_proj, module.down_proj, index, weights, n_active
        )
        for name, max_tokens in _layouts():
            fe_kernel.EXPERT_GRID_MAX_TOKENS = max_tokens
            seconds, how = time_case(run, device, quick=False)
            unique = int(index[:, :n].unique().numel())
            rec = dict(
                layout=name, kept_per_token=n, unique_experts=unique, us=round(seconds * 1e6, 1), timing=how,
                GBps=round(unique * per_expert / seconds / 1e9, 1),
            )  # fmt: skip
            if n in (8, 4):
                rec["profile"] = _profile(run)
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "profile"}), flush=True)
        fe_kernel.EXPERT_GRID_MAX_TOKENS = default
        bar.update(1)
    del module
    torch.cuda.empty_cache()
    return records


@torch.no_grad()
def step(device, dtype, names: list[str], repeats: int, bar) -> dict:
    from benchmarks.bench_sparse_verify import SETTINGS, _contexts
    from hf_sparse_verify.drivers.machine import median, time_calls
    from hf_sparse_verify.drivers.shapes import random_model
    from hf_sparse_verify.generation.engine.runner import ModelRunner
    from hf_sparse_verify.sparse.state import SparseVerifyState
    from hf_sparse_verify.step import Phase

    model = random_model("qwen3-30b-a3b", device, dtype)
    context, layers = 1024, model.config.num_hidden_layers
    ids = torch.randint(0, model.config.vocab_size, (1, WIDTH), device=device)
    out = {}
    records = []
    default = fe_kernel.EXPERT_GRID_MAX_TOKENS
    with _contexts(model, device):
        for (
            layout,
            max_tokens,
        ) in _layouts():  # a runner each: graphs are captured with the layout of the time
            fe_kernel.EXPERT_GRID_MAX_TOKENS = max_tokens
            runner = ModelRunner(model, 1, context + WIDTH, device, "triton")
            zero = torch.zeros(1, dtype=torch.long, device=device)
            runner.forward(torch.zeros(1, 1, dtype=torch.long, device=device), zero, Phase.PREFILL, kv_len=1)
            for lay in runner.cache.layers:
                lay.keys.normal_()
                lay.values.normal_()
            start = torch.full((1,), context, dtype=torch.long, device=device)
            runner.capture([1, WIDTH])
            timed = functools.partial(time_calls, device=device, warmups=3, repeats=repeats)
            calls = {
                "decode": functools.partial(
                    runner.forward, ids[:, :1], start, Phase.VERIFY, kv_len=context + 1
                ),
                "dense": functools.partial(runner.forward, ids, start, Phase.VERIFY, kv_len=context + WIDTH),
            }
            for name in names:
                state = SparseVerifyState(SETTINGS[name], layers, None, runner.cache.layer_devices(device))
                state.prefill(runner.cache, runner.pad_t, start)
                runner.capture([WIDTH], Phase.VERIFY, verify_sparsity=state)
                calls[name] = functools.partial(
                    runner.forward, ids, start, Phase.VERIFY, kv_len=context + WIDTH, verify_sparsity=state
                )
            for name, call in calls.items():
                ms = round(1000 * median(timed(call)), 4)
                rec = dict(layout=layout, setting=name, ms=ms, profile=_profile(call))
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "profile"}), flush=True)
                bar.update(1)
            del runner, calls
    fe_kernel.EXPERT_GRID_MAX_TOKENS = default
    out["records"] = records
    for rec in records:
        print(f"== {rec['layout']} {rec['setting']}: {rec['ms']} ms; GPU {rec['profile'][0]['total_us']} us")
        for row in rec["profile"][1:9]:
            print(f"   {row['us_per_step']:9.1f} us {row['calls_per_step']:6.1f}x  {row['kernel']}")
    del model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="*", default=["layer", "step"])
    parser.add_argument("--settings", nargs="*", default=["moe_skip1", "moe_skip2", "moe_skip4", "moe_skip6"])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    result = dict(machine=machine_info(device), args=vars(args))
    with tqdm(total=8 * ("layer" in args.sections) + 2 * (2 + len(args.settings)) * ("step" in args.sections),
              desc="moe skip", file=sys.stderr) as bar:  # fmt: skip
        if "layer" in args.sections:
            result["layer"] = layer(device, dtype, bar)
        if "step" in args.sections:
            result["step"] = step(device, dtype, args.settings, args.repeats, bar)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
