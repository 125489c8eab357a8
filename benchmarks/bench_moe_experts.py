"""Issue 13 on a GPU: the fused experts op against its bandwidth floor and transformers' experts implementations,
a tile sweep, and the whole Qwen3-30B-A3B step with the fused experts against ``batched_mm``, side by side.

Sections (``--sections``, default all):

- ``layer``: one Qwen3-30B-A3B experts layer (128 experts, top-8, hidden 2048, FFN 768, bf16), uniformly random
  routing, T = 1 (decode), 8 and 16 (verify) tokens: ``triton`` (ours), ``batched_mm``, ``grouped_mm``; each timed
  as a CUDA graph of 20 launches (``grouped_mm`` eagerly where capture fails). floor = bytes of the distinct
  selected experts (+ activations) / ``--bandwidth`` (default 4.3 TB/s, H200 HBM); also the share of the measured
  copy bandwidth. Also the largest difference between ours and ``batched_mm``.
- ``sweep``: ours over tile settings (`kernel.TILES`): gate/up tiles and stages first, then down tiles and warps
  with the best of those; prints the best setting (sum of the three T's times).
- ``sweep1``: ours at one token (decode) over the one-token tile settings (`kernel.TILES_ONE_TOKEN`).
- ``step``: the ``qwen3-30b-a3b`` random-weight model, 1K context, batch 1, widths 1..16, our captured step
  (`hf_sparse_verify.drivers.step_bench`) with the fused experts and with ``batched_mm``; floor as ``hsv bench step``
  ((weights the step must read, ``min(E, T k)`` experts per layer, + KV) / measured copy bandwidth) and with the
  expected number of distinct experts under uniform routing, ``E (1 - (1 - k/E)^T)``. Issue targets: decode <= 2.0x
  floor, 8 tokens <= 1.5x its floor, 16 tokens <= 2.0x our decode.
- ``profile``: CUDA kernels of replays of the captured decode (and 8-token) step, grouped by name.

``python benchmarks/bench_moe_experts.py --json out.json`` (run from the repository root).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_kernels import time_case
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.drivers.profile import kernel_rows
from hf_sparse_verify.kernels.fused_experts import bench as fe_bench
from hf_sparse_verify.kernels.fused_experts import fused_experts
from hf_sparse_verify.kernels.fused_experts import kernel as fe_kernel

TOKENS = (1, 8, 16)
FUSED_KERNELS = ("_align_kernel", "_gate_up_kernel", "_down_kernel", "_sum_kernel")


def _layer_inputs(module, tokens: int, device, dtype):
    x = torch.randn(tokens, fe_bench.HIDDEN, device=device, dtype=dtype)
    index, weights = fe_bench.route(tokens, fe_bench.EXPERTS, fe_bench.TOP_K, device, dtype, seed=tokens)
    floor_bytes = fe_bench.unique_expert_bytes(module, index) + 2 * x.numel() * x.element_size()
    return x, index, weights, floor_bytes


def layer(module, device, dtype, bandwidth: float, copy_bw: float, bar) -> list[dict]:
    records = []
    for tokens in TOKENS:
        x, index, weights, floor_bytes = _layer_inputs(module, tokens, device, dtype)
        ours = fused_experts(x, module.gate_up_proj, module.down_proj, index, weights)
        theirs = fe_bench.transformers_experts("batched_mm", module, x, index, weights)
        diff = ((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max()).item()
        runs = {
            "triton": functools.partial(
                fused_experts, x, module.gate_up_proj, module.down_proj, index, weights
            ),
            "batched_mm": functools.partial(
                fe_bench.transformers_experts, "batched_mm", module, x, index, weights
            ),
            "grouped_mm": functools.partial(
                fe_bench.transformers_experts, "grouped_mm", module, x, index, weights
            ),
        }
        times = {}
        for variant, run in runs.items():
            seconds, timing = time_case(run, device, quick=False)
            times[variant] = seconds
            floor_us = floor_bytes / bandwidth * 1e6
            records.append(
                dict(
                    tokens=tokens, variant=variant, us=round(seconds * 1e6, 2), timing=timing,
                    unique_experts=int(index.unique().numel()), floor_us=round(floor_us, 2),
                    over_floor=round(seconds * 1e6 / floor_us, 3),
                    share_of_copy=round(floor_bytes / seconds / copy_bw, 3),
                    max_rel_diff_vs_batched_mm=diff,
                )
            )  # fmt: skip
            bar.update(1)
        for r in records[-3:]:
            r["batched_mm_over_this"] = round(times["batched_mm"] / (r["us"] / 1e6), 3)
    return records


def _time_with_tiles(tiles: dict, module, inputs, device, table: dict | None = None) -> dict[int, float]:
    table = fe_kernel.TILES if table is None else table
    saved = dict(table)
    table.update(tiles)
    try:
        out = {}
        for tokens, (x, index, weights, _) in inputs.items():
            run = functools.partial(fused_experts, x, module.gate_up_proj, module.down_proj, index, weights)
            out[tokens] = time_case(run, device, quick=False)[0] * 1e6
        return out
    finally:
        table.clear()
        table.update(saved)


def sweep(module, device, dtype, bar) -> dict:
    inputs = {t: _layer_inputs(module, t, device, dtype) for t in TOKENS}
    records = []

    def trial(tiles: dict) -> float:
        try:
            us = _time_with_tiles(tiles, module, inputs, device)
        except Exception as err:  # e.g. out of shared memory: record and go on
            records.append(dict(tiles=tiles, error=repr(err)[:200]))
            bar.update(1)
            return float("inf")
        records.append(
            dict(tiles=tiles, us={t: round(v, 2) for t, v in us.items()}, total_us=sum(us.values()))
        )
        print(json.dumps(records[-1]), flush=True)
        bar.update(1)
        return sum(us.values())

    best = dict(fe_kernel.TILES)
    best_total = trial(best)
    for gn, gk, stages in itertools.product((16, 32, 64), (64, 128, 256), (3, 4)):
        tiles = {**best, "gate_up_n": gn, "gate_up_k": gk, "num_stages": stages}
        total = trial(tiles)
        if total < best_total:
            best, best_total = tiles, total
    for dn, dk, warps in itertools.product((32, 64, 128), (64, 128, 256), (4, 8)):
        tiles = {**best, "down_n": dn, "down_k": dk, "num_warps": warps}
        total = trial(tiles)
        if total < best_total:
            best, best_total = tiles, total
    return dict(default=dict(fe_kernel.TILES), best=best, best_total_us=round(best_total, 2), records=records)


def sweep_one_token(module, device, dtype, bar) -> dict:
    """`kernel.TILES_ONE_TOKEN` for decode (T = 1): gate/up tiles, stages and warps, then down tiles with the best."""
    inputs = {1: _layer_inputs(module, 1, device, dtype)}
    table = fe_kernel.TILES_ONE_TOKEN
    records = []

    def trial(tiles: dict) -> float:
        try:
            us = _time_with_tiles(tiles, module, inputs, device, table)[1]
        except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: record and go on
            records.append(dict(tiles=tiles, error=repr(err)[:200]))
            bar.update(1)
            return float("inf")
        records.append(dict(tiles=tiles, us=round(us, 2)))
        bar.update(1)
        return us

    best = dict(table)
    best_us = trial(best)
    for gn, gk, stages, warps in itertools.product((16, 32, 64), (64, 128, 256), (2, 3, 4), (2, 4, 8)):
        tiles = {**best, "gate_up_n": gn, "gate_up_k": gk, "num_stages": stages, "num_warps": warps}
        us = trial(tiles)
        if us < best_us:
            best, best_us = tiles, us
    for dn, dk in itertools.product((16, 32, 64, 128), (64, 128, 256)):
        tiles = {**best, "down_n": dn, "down_k": dk}
        us = trial(tiles)
        if us < best_us:
            best, best_us = tiles, us
    print(
        f"one token: default {dict(table)} -> best {best} ({best_us:.1f} us; default {records[0].get('us')})"
    )
    return dict(default=dict(table), best=best, best_us=round(best_us, 2), records=records)


def _expected_unique(tokens: int, experts: int, top_k: int) -> float:
    return experts * (1 - (1 - top_k / experts) ** tokens)


def step(device, dtype, copy_bw: float, repeats: int, bar) -> list[dict]:
    from hf_sparse_verify.drivers.shapes import kv_bytes, random_model, weight_bytes_per_step
    from hf_sparse_verify.drivers.step_bench import StepBenchArgs, _ours

    args = StepBenchArgs(
        shape="qwen3-30b-a3b", contexts=(1024,), new_tokens=(1, 2, 4, 8, 16), repeats=repeats
    )
    model = random_model(args.shape, device, dtype)
    config = model.config
    widths = sorted(args.new_tokens)
    per_expert = (
        3 * config.hidden_size * config.moe_intermediate_size * torch.empty((), dtype=dtype).element_size()
    )
    times = {}
    for experts_impl in ("hsv_fused", "batched_mm"):
        # decoding_experts() switches only transformers' default (grouped_mm): batched_mm set here is kept
        model.set_experts_implementation("grouped_mm" if experts_impl == "hsv_fused" else "batched_mm")
        times[experts_impl], _, mode = _ours(model, 1024, 1, widths, args, device, bar)
    model.set_experts_implementation("grouped_mm")
    records = []
    for width in widths:
        moved = weight_bytes_per_step(model, width, 1) + kv_bytes(model, 1024, 1, dtype)
        reachable = min(config.num_experts, width * config.num_experts_per_tok)
        unique = _expected_unique(width, config.num_experts, config.num_experts_per_tok)
        moved_unique = moved - int((reachable - unique) * per_expert * config.num_hidden_layers)
        fused, batched = times["hsv_fused"][width], times["batched_mm"][width]
        records.append(
            dict(
                context=1024, new_tokens=width, mode=mode, fused_ms=round(fused, 4), batched_mm_ms=round(batched, 4),
                batched_mm_over_fused=round(batched / fused, 3),
                floor_ms=round(1000 * moved / copy_bw, 4), fused_over_floor=round(fused / (1000 * moved / copy_bw), 3),
                floor_unique_ms=round(1000 * moved_unique / copy_bw, 4),
                fused_over_floor_unique=round(fused / (1000 * moved_unique / copy_bw), 3),
                fused_over_fused_decode=round(fused / times["hsv_fused"][1], 3),
            )
        )  # fmt: skip
    del model
    torch.cuda.empty_cache()
    return records


def profile_steps(device, dtype, steps: int = 10) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from hf_sparse_verify.drivers.shapes import random_model
    from hf_sparse_verify.generation.engine.runner import ModelRunner
    from hf_sparse_verify.integrations import Mode, speculation_mode
    from hf_sparse_verify.step import Phase

    model = random_model("qwen3-30b-a3b", device, dtype)
    results = []
    with speculation_mode(model, mode=Mode(fused=True)) as switched, switched.decoding_experts():
        runner = ModelRunner(model, 1, 1024 + 16, device, "triton")
        zero, at = torch.zeros(1, dtype=torch.long, device=device), torch.tensor([1000], device=device)
        runner.forward(torch.zeros(1, 1, dtype=torch.long, device=device), zero, Phase.PREFILL, kv_len=1)
        for width in (1, 8):
            assert runner.capture([width]), "capture failed"
            ids = torch.randint(0, 1000, (1, width), device=device)
            for _ in range(3):
                runner.forward(ids, at, Phase.VERIFY, kv_len=1000 + width)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    runner.forward(ids, at, Phase.VERIFY, kv_len=1000 + width)
                torch.cuda.synchronize()
            rows = [dict(r, us_per_step=round(r["us_per_step"], 1)) for r in kernel_rows(prof, steps)]
            total = sum(r["us_per_step"] for r in rows)
            experts_us = sum(r["us_per_step"] for r in rows if any(k in r["kernel"] for k in FUSED_KERNELS))
            results.append(dict(width=width, gpu_ms=round(total / 1000, 4), fused_experts_ms=round(experts_us / 1000, 4),
                                kernels_per_step=sum(r["calls_per_step"] for r in rows), rows=rows[:25]))  # fmt: skip
            print(f"width {width}: {total / 1000:.3f} ms GPU time, fused experts {experts_us / 1000:.3f} ms")
            for r in rows[:15]:
                print(f"{r['us_per_step']:9.1f} us  {r['calls_per_step']:6.1f}x  {r['kernel']}")
    del model, runner
    torch.cuda.empty_cache()
    return results


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="*", default=["layer", "sweep", "step", "profile"])
    parser.add_argument("--bandwidth", type=float, default=4.3e12, help="bytes/s for the layer floor")
    parser.add_argument("--repeats", type=int, default=10, help="step timing repeats")
    _records.add_arguments(parser, "moe_experts")
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    copy_bw = copy_bandwidth(device)
    result = dict(machine=machine_info(device), copy_bandwidth_GBps=round(copy_bw / 1e9, 1),
                  floor_bandwidth_GBps=args.bandwidth / 1e9, tiles=dict(fe_kernel.TILES))  # fmt: skip
    module = fe_bench.experts_module(device, dtype)
    with tqdm(desc="moe experts", file=sys.stderr) as bar:
        if "layer" in args.sections:
            result["layer"] = layer(module, device, dtype, args.bandwidth, copy_bw, bar)
            print("tokens  variant      us      floor_us  over_floor  batched_mm/this  unique  rel_diff")
            for r in result["layer"]:
                print(f"{r['tokens']:>6}  {r['variant']:<10} {r['us']:>8.1f}  {r['floor_us']:>8.1f}  "
                      f"{r['over_floor']:>10.2f}  {r['batched_mm_over_this']:>15.2f}  {r['unique_experts']:>6}  "
                      f"{r['max_rel_diff_vs_batched_mm']:.1e}")  # fmt: skip
        if "sweep1" in args.sections:
            result["sweep1"] = sweep_one_token(module, device, dtype, bar)
        if "sweep" in args.sections:
            result["sweep"] = sweep(module, device, dtype, bar)
            print(f"tiles: default {result['sweep']['default']}\n       best    {result['sweep']['best']} "
                  f"({result['sweep']['best_total_us']} us for T = {TOKENS})")  # fmt: skip
        del module
        torch.cuda.empty_cache()
        if "step" in args.sections:
            result["step"] = step(device, dtype, copy_bw, args.repeats, bar)
            print("new  fused_ms  batched_mm_ms  speedup  floor_ms  fused/floor  floor_uniq  fused/floor_uniq  "
                  "fused/decode")  # fmt: skip
            for r in result["step"]:
                print(f"{r['new_tokens']:>3}  {r['fused_ms']:>8.3f}  {r['batched_mm_ms']:>13.3f}  "
                      f"{r['batched_mm_over_fused']:>7.2f}  {r['floor_ms']:>8.3f}  {r['fused_over_floor']:>11.2f}  "
                      f"{r['floor_unique_ms']:>10.3f}  {r['fused_over_floor_unique']:>16.2f}  "
                      f"{r['fused_over_fused_decode']:>12.2f}")  # fmt: skip
        if "profile" in args.sections:
            result["profile"] = profile_steps(device, dtype)
    if args.json:
        _records.save(args, result, device, setting=" ".join(args.sections))


if __name__ == "__main__":
    main()
