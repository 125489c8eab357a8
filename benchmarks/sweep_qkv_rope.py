"""Tile sweeps of the attention projection kernels (`hf_sparse_verify.kernels.qkv_rope`) on the Llama-3.1-8B and
Qwen3-30B-A3B attention shapes: ``qkv_proj`` (``--kernel qkv``, against three ``F.linear``) or the output projection
``row_linear`` (``--kernel out``, against one ``F.linear``), each setting timed as a CUDA graph
(``bench_kernels.time_case``), beside the weights' bytes at the measured copy bandwidth. Prints the best setting
(sum over shapes and rows) and the best per case; `kernel.TILES` is set by hand from them.

``python benchmarks/sweep_qkv_rope.py --kernel out --shapes qwen3-30b-a3b --rows 1 16 --json out.json``
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_kernels import time_case
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.qkv_rope import kernel as qkv_kernel
from hf_sparse_verify.kernels.qkv_rope import qkv_proj, row_linear
from hf_sparse_verify.kernels.qkv_rope.bench import SHAPES

ROWS = (1, 16)


def _cublas(x, weights):
    return [F.linear(x, w) for w in weights]


def _time(fn, device) -> float:
    return time_case(fn, device, quick=False)[0] * 1e6


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _records.add_arguments(parser, "sweep_qkv_rope")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=list(ROWS))
    parser.add_argument(
        "--wide", action="store_true", help="also BLOCK_N 128, BLOCK_K 512, 2 warps, 2 and 5 stages"
    )
    parser.add_argument(
        "--kernel", choices=("qkv", "out"), default="qkv",
        help="qkv: qkv_proj (TILES proj_*); out: row_linear on the attention output projection (TILES out_*)",
    )  # fmt: skip
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    cases = []
    for name in args.shapes:
        hidden, heads_q, heads_kv, dim, _ = SHAPES[name]
        if args.kernel == "qkv":
            ws = [
                torch.randn(h * dim, hidden, device=device, dtype=dtype) * 0.02
                for h in (heads_q, heads_kv, heads_kv)
            ]
        else:
            ws = [torch.randn(hidden, heads_q * dim, device=device, dtype=dtype) * 0.02]
        for rows in args.rows:
            cases.append((name, rows, torch.randn(rows, ws[0].shape[1], device=device, dtype=dtype), ws))
    kernel_fn = qkv_proj if args.kernel == "qkv" else row_linear
    keys = (
        ("proj_n", "proj_k", "num_warps", "num_stages")
        if args.kernel == "qkv"
        else ("out_n", "out_k", "out_warps", "out_stages")
    )
    saved = dict(qkv_kernel.TILES)
    result = dict(
        machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1), baseline=[], trials=[]
    )
    for name, rows, x, ws in cases:
        result["baseline"].append(dict(
            shape=name, rows=rows, torch_us=round(_time(functools.partial(_cublas, x, ws), device), 2),
            floor_us=round(1e6 * sum(w.numel() for w in ws) * 2 / bandwidth, 2),
        ))  # fmt: skip
    if args.wide:
        grid = list(itertools.product((16, 32, 64, 128), (128, 256, 512), (2, 4, 8), (2, 3, 4, 5)))
    elif args.kernel == "out":
        grid = list(itertools.product((16, 32, 64), (128, 256, 512), (2, 4), (3, 4, 5)))
    else:
        grid = list(itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 4)))
    best = (float("inf"), None)
    with tqdm(total=len(grid), desc=f"{args.kernel} tiles", file=sys.stderr) as bar:
        for n, k, warps, stages in grid:
            qkv_kernel.TILES.update(zip(keys, (n, k, warps, stages)))
            try:
                per_case = [_time(functools.partial(kernel_fn, x, *ws), device) for _, _, x, ws in cases]
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
        (t["cases_us"] for t in timed if t["tiles"] == [saved[key] for key in keys]), None
    )
    print(json.dumps(result["baseline"], indent=1))
    print("default", saved, "best", json.dumps(result["best"]))
    for case, tiles in result["best_per_case"].items():
        t = next(t for t in timed if t["tiles"] == tiles)
        print(
            case, "best", tiles, t["cases_us"][case], "default", (result["default_per_case"] or {}).get(case)
        )
    if args.json:
        _records.save(args, result, device, setting=args.kernel)


if __name__ == "__main__":
    main()
