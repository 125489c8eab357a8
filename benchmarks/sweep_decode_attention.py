"""Tile sweep of the split-KV decode/verify attention kernel (`hf_sparse_verify.kernels.decode_attention`) on the
long-context shapes of `bench_long.py` (Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128; random bf16 caches).

For each (batch, context, new tokens) case, every setting of ``block_n x num_warps x num_stages x splits`` is timed
as a CUDA graph (``bench_kernels.time_case``), with and without Vegas' two-row softmax-weight scores, against the
K/V bytes at the measured copy bandwidth. Prints and writes the best setting per ``BLOCK_M`` (the split kernel's
query rows); `kernel.TILES_BY_ROWS` is set by hand from it.

``python benchmarks/sweep_decode_attention.py --json out.json``
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
from hf_sparse_verify.kernels._triton import next_power_of_2
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.decode_attention import kernel as attn_kernel
from hf_sparse_verify.kernels.decode_attention.op import default_splits

HEADS, KV_HEADS, DIM = 32, 8, 128
CASES = ((4, 65536), (16, 16384))
WIDTHS = (1, 5, 7, 9)


def _run(args, tiles, splits, scores):
    saved = dict(attn_kernel.TILES_BY_ROWS)
    saved_weights = dict(attn_kernel.TILES_WITH_WEIGHTS)
    block_m = max(16, next_power_of_2(HEADS // KV_HEADS * args[0].shape[2]))
    attn_kernel.TILES_BY_ROWS[block_m] = tiles
    attn_kernel.TILES_WITH_WEIGHTS.clear()  # the grid's setting holds for the score variant too
    try:
        if scores:
            return decode_attention(*args, num_splits=splits, collect="two_rows", weights=True)
        return decode_attention(*args, num_splits=splits)
    finally:
        attn_kernel.TILES_BY_ROWS.clear()
        attn_kernel.TILES_BY_ROWS.update(saved)
        attn_kernel.TILES_WITH_WEIGHTS.update(saved_weights)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _records.add_arguments(parser, "sweep_decode_attention")
    parser.add_argument("--cases", nargs="*", default=[f"{b}x{c}" for b, c in CASES], help="batch x context")
    parser.add_argument("--widths", nargs="*", type=int, default=list(WIDTHS), help="new tokens per row")
    parser.add_argument("--stages", nargs="*", type=int, default=[2, 3])
    parser.add_argument("--block-n", nargs="*", type=int, default=[32, 64, 128])
    parser.add_argument("--warps", nargs="*", type=int, default=[4, 8])
    parser.add_argument(
        "--split-mults", nargs="*", type=int, default=[1, 2], help="multiples of default_splits"
    )
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    cases = [tuple(int(x) for x in case.split("x")) for case in args.cases]
    widths = args.widths
    grid = list(itertools.product(tuple(args.block_n), tuple(args.warps), tuple(args.stages)))
    result = dict(machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1), records=[])
    total = len(cases) * sum(2 if w > 1 else 1 for w in widths) * len(grid) * len(args.split_mults)
    bar = tqdm(total=total, desc="decode_attention tiles", file=sys.stderr)
    for batch, context in cases:
        gen = torch.Generator(device="cpu").manual_seed(context)
        key = torch.randn(batch, KV_HEADS, context, DIM, generator=gen).to(device, dtype)
        value = torch.randn(batch, KV_HEADS, context, DIM, generator=gen).to(device, dtype)
        floor_us = 1e6 * 2 * key.numel() * 2 / bandwidth
        for q_len in widths:
            query = torch.randn(batch, HEADS, q_len, DIM, generator=gen).to(device, dtype)
            start = torch.full((batch,), context - q_len, device=device)
            pad = torch.zeros(batch, dtype=torch.long, device=device)
            call = (query, key, value, start, pad, DIM**-0.5)
            base_splits = default_splits(batch, KV_HEADS, context)
            for (block_n, warps, stages), mult in itertools.product(grid, args.split_mults):
                splits = min(128, base_splits * mult)
                tiles = dict(block_n=block_n, num_warps=warps, num_stages=stages)
                for scores in (False, True) if q_len > 1 else (False,):
                    record = dict(batch=batch, context=context, q_len=q_len, scores=scores, splits=splits,
                                  block_m=max(16, next_power_of_2(HEADS // KV_HEADS * q_len)),
                                  floor_us=round(floor_us, 1), **tiles)  # fmt: skip
                    try:
                        us = (
                            time_case(functools.partial(_run, call, tiles, splits, scores), device, False)[0]
                            * 1e6
                        )
                        record["us"] = round(us, 1)
                    except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                        record["error"] = repr(err)[:160]
                    result["records"].append(record)
                    bar.update(1)
            del query
        del key, value
        torch.cuda.empty_cache()
    bar.close()
    if args.json:  # the raw timings first: the summary below must not lose them
        _records.save(args, result, device, setting="tiles")
    best: dict = {}
    for block_m in sorted({r["block_m"] for r in result["records"]}):
        for scores in (False, True):
            ok = [
                r
                for r in result["records"]
                if r["block_m"] == block_m and r["scores"] == scores and "us" in r
            ]
            by_setting: dict = {}
            for r in ok:
                by_setting.setdefault(
                    (
                        r["block_n"],
                        r["num_warps"],
                        r["num_stages"],
                        round(r["splits"] / default_splits(r["batch"], KV_HEADS, r["context"])),
                    ),
                    [],
                ).append(r)
            sums = {k: sum(r["us"] for r in v) for k, v in by_setting.items()}
            if not sums:
                continue
            default = attn_kernel.split_tiles(block_m, scores)
            key_default = (default["block_n"], default["num_warps"], default["num_stages"], 1)
            winner = min(sums, key=sums.get)
            best[f"{block_m}_{'scores' if scores else 'plain'}"] = dict(
                best=dict(zip(("block_n", "num_warps", "num_stages", "split_mult"), winner)),
                best_sum_us=round(sums[winner], 1), default_sum_us=round(sums.get(key_default, float("nan")), 1),
                cases=len(by_setting[winner]),
                per_case=[dict(batch=r["batch"], context=r["context"], q_len=r["q_len"], us=r["us"],
                               default_us=next((d["us"] for d in by_setting.get(key_default, [])
                                                if (d["batch"], d["context"], d["q_len"]) == (r["batch"], r["context"], r["q_len"])), None),
                               floor_us=r["floor_us"]) for r in by_setting[winner]],
            )  # fmt: skip
    result["best"] = best
    print(json.dumps(best, indent=1))
    if args.json:
        _records.save(args, result, device, setting="tiles")


if __name__ == "__main__":
    main()
