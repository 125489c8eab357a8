"""Side by side on one GPU: the MoE router with the logits in the kernel (one launch) vs ``F.linear`` + the routing
kernel vs transformers' eager arithmetic, at the Qwen3-30B-A3B size, and the decode/verify step with either path.

- ``router``: one CUDA graph per (variant, rows) of ``--layers`` back-to-back router calls on distinct weights (a
  step's routers, launch gaps included); microseconds per call = graph time / layers, median of ``--rounds``
  rounds of ``--replays`` replays, variants interleaved within each round.
- ``step``: `hf_sparse_verify.drivers.step_bench.run_on` on one random-weight model, with
  ``kernel.LOGITS_IN_KERNEL`` on and off, alternated ``--step-rounds`` times.

Usage: ``python benchmarks/bench_moe_router_fused.py --json out.json [--no-step]``
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.kernels.moe_router import kernel
from hf_sparse_verify.kernels.moe_router.bench import EXPERTS, HIDDEN, TOP_K, eager_router


def _with(setting: str, value: int, fn, x, w):
    """``fn`` with the router kernel's module-level ``setting`` (``FUSED_NUM_WARPS``, ``TARGET_PROGRAMS``) set to
    ``value`` for the call."""
    saved = getattr(kernel, setting)
    setattr(kernel, setting, value)
    try:
        return fn(x, w, TOP_K, True, False)
    finally:
        setattr(kernel, setting, saved)


def _variants() -> dict:
    new = functools.partial(kernel.launch, logits_in_kernel=True)
    return {
        "fused": lambda x, w: new(x, w, TOP_K, True, False),
        "fused_slice512": lambda x, w: new(x, w, TOP_K, True, False, h_slice=512),
        "fused_warps2": functools.partial(_with, "FUSED_NUM_WARPS", 2, new),
        "fused_warps8": functools.partial(_with, "FUSED_NUM_WARPS", 8, new),
        "fused_programs32": functools.partial(_with, "TARGET_PROGRAMS", 32, new),
        "fused_programs128": functools.partial(_with, "TARGET_PROGRAMS", 128, new),
        "fused_programs256": functools.partial(_with, "TARGET_PROGRAMS", 256, new),
        "linear+triton": lambda x, w: kernel.launch(x, w, TOP_K, True, False, logits_in_kernel=False),
        "eager": lambda x, w: eager_router(x, w, TOP_K),
    }


def _graph(fn, x, weights) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for w in weights:
                fn(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(x, w)
    return graph


def _time_graph(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / replays  # us per replay


def router(layers: int, replays: int, rounds: int) -> list[dict]:
    dtype = torch.bfloat16
    weights = [torch.randn(EXPERTS, HIDDEN, device="cuda", dtype=dtype) / HIDDEN**0.5 for _ in range(layers)]
    records = []
    for tokens in (1, 8, 16):
        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=dtype)
        graphs = {name: _graph(fn, x, weights) for name, fn in _variants().items()}
        times = {name: [] for name in graphs}
        for _ in range(rounds):
            for name, graph in graphs.items():
                times[name].append(_time_graph(graph, replays) / layers)
        us = {name: round(statistics.median(t), 3) for name, t in times.items()}
        records.append(
            dict(
                tokens=tokens,
                us_per_call=us,
                old_over_new=round(us["linear+triton"] / us["fused"], 3),
                eager_over_new=round(us["eager"] / us["fused"], 3),
            )
        )
        print(records[-1], flush=True)
        del graphs
    return records


def step(rounds: int, repeats: int) -> list[dict]:
    from hf_sparse_verify.drivers.shapes import random_model
    from hf_sparse_verify.drivers.step_bench import StepBenchArgs, run_on

    device = torch.device("cuda")
    model = random_model("qwen3-30b-a3b", device, torch.bfloat16)
    args = StepBenchArgs(
        shape="qwen3-30b-a3b", contexts=(1024,), new_tokens=(1, 8), transformers=False, repeats=repeats
    )
    out = []
    for r in range(rounds):
        for in_kernel in (True, False):
            kernel.LOGITS_IN_KERNEL = in_kernel
            with torch.no_grad():
                result = run_on(model, args, device)
            rec = {
                "round": r,
                "logits_in_kernel": in_kernel,
                **{f"ms_new_tokens_{x['new_tokens']}": x["ours_ms"] for x in result["records"]},
                **{f"over_floor_{x['new_tokens']}": x.get("ours_over_floor") for x in result["records"]},
                "mode": result["records"][0]["ours_mode"],
            }
            print(rec, flush=True)
            out.append(rec)
    kernel.LOGITS_IN_KERNEL = True
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _records.add_arguments(parser, "moe_router_fused")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-step", action="store_true")
    parser.add_argument("--step-rounds", type=int, default=2)
    parser.add_argument("--step-repeats", type=int, default=30)
    args = parser.parse_args()
    from hf_sparse_verify.drivers.machine import machine_info

    result = dict(
        machine=machine_info(torch.device("cuda")),
        shape=dict(experts=EXPERTS, top_k=TOP_K, hidden=HIDDEN, dtype="bfloat16"),
        method=f"router: graph of {args.layers} back-to-back calls on distinct weights, us per call = median over "
        f"{args.rounds} interleaved rounds of {args.replays} replays / {args.layers}; step: bench.step.run_on, "
        f"context 1024, median of {args.step_repeats} calls, old/new alternated",
        fused_split=dict(zip(("h_slice", "splits"), kernel.fused_split(EXPERTS, HIDDEN))),
        router=router(args.layers, args.replays, args.rounds),
    )
    _records.save(args, result, "cuda", setting="logits_in_kernel")
    if not args.no_step:
        result["step"] = step(args.step_rounds, args.step_repeats)
        _records.save(args, result, "cuda", setting="logits_in_kernel")


if __name__ == "__main__":
    main()
