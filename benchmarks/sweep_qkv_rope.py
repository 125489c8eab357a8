"""Tile sweep of the attention projection kernel (`hf_sparse_verify.kernels.qkv_rope`): ``qkv_proj`` on the
Llama-3.1-8B and Qwen3-30B-A3B attention shapes at 1 and 16 rows, each setting timed as a CUDA graph
(``bench_kernels.time_case``), against three ``F.linear`` (cuBLAS) and the weights' bytes at the measured copy
bandwidth. Prints the best setting (sum over shapes and rows); `kernel.TILES` is set by hand from it.

A one-launch Triton output projection (``row_linear``, tiled the same way) was swept in the same run on the H200 and
dropped: 37.4 us summed over the four cases at its best tiles against 36.5 us for ``F.linear``.

``python benchmarks/sweep_qkv_rope.py --json out.json``
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks.bench_kernels import time_case
from hf_sparse_verify.bench.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.qkv_rope import kernel as qkv_kernel
from hf_sparse_verify.kernels.qkv_rope import qkv_proj
from hf_sparse_verify.kernels.qkv_rope.bench import SHAPES

ROWS = (1, 16)


def _three(x, weights):
    return [F.linear(x, w) for w in weights]


def _time(fn, device) -> float:
    return time_case(fn, device, quick=False)[0] * 1e6


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument(
        "--wide", action="store_true", help="also BLOCK_N 128, BLOCK_K 512, 2 warps, 2 and 5 stages"
    )
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    cases = []
    for name in args.shapes:
        hidden, heads_q, heads_kv, dim, _ = SHAPES[name]
        ws = [
            torch.randn(h * dim, hidden, device=device, dtype=dtype) * 0.02
            for h in (heads_q, heads_kv, heads_kv)
        ]
        for rows in args.rows:
            cases.append((name, rows, torch.randn(rows, hidden, device=device, dtype=dtype), ws))
    saved = dict(qkv_kernel.TILES)
    result = dict(
        machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1), baseline=[], trials=[]
    )
    for name, rows, x, ws in cases:
        result["baseline"].append(dict(
            shape=name, rows=rows, torch_us=round(_time(functools.partial(_three, x, ws), device), 2),
            floor_us=round(1e6 * sum(w.numel() for w in ws) * 2 / bandwidth, 2),
        ))  # fmt: skip
    if args.wide:
        grid = list(itertools.product((16, 32, 64, 128), (128, 256, 512), (2, 4, 8), (2, 3, 4, 5)))
    else:
        grid = list(itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 4)))
    best = (float("inf"), None)
    with tqdm(total=len(grid), desc="qkv_proj tiles", file=sys.stderr) as bar:
        for n, k, warps, stages in grid:
            qkv_kernel.TILES.update(proj_n=n, proj_k=k, num_warps=warps, num_stages=stages)
            try:
                per_case = [_time(functools.partial(qkv_proj, x, *ws), device) for _, _, x, ws in cases]
                us = sum(per_case)
            except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                result["trials"].append(dict(tiles=[n, k, warps, stages], error=repr(err)[:200]))
                bar.update(1)
                continue
            result["trials"].append(dict(
                tiles=[n, k, warps, stages], sum_us=round(us, 2),
                cases_us={f"{name} x{rows}": round(t, 2) for (name, rows, _, _), t in zip(cases, per_case)},
            ))  # fmt: skip
            best = min(best, (us, [n, k, warps, stages]), key=lambda b: b[0])
            bar.update(1)
    qkv_kernel.TILES.clear()
    qkv_kernel.TILES.update(saved)
    result["best"] = dict(sum_us=round(best[0], 2), tiles_n_k_warps_stages=best[1])
    timed = [t for t in result["trials"] if "cases_us" in t]
    result["best_per_case"] = (
        {case: min(timed, key=lambda t, c=case: t["cases_us"][c])["tiles"] for case in timed[0]["cases_us"]}
        if timed
        else {}
    )
    result["default_per_case"] = next(
        (t["cases_us"] for t in timed if t["tiles"] == [saved["proj_n"], saved["proj_k"], saved["num_warps"],
                                                       saved["num_stages"]]), None)  # fmt: skip
    print(json.dumps(result["baseline"], indent=1))
    print("default", saved, "best", json.dumps(result["best"]))
    for case, tiles in result["best_per_case"].items():
        t = next(t for t in timed if t["tiles"] == tiles)
        print(
            case, "best", tiles, t["cases_us"][case], "default", (result["default_per_case"] or {}).get(case)
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
