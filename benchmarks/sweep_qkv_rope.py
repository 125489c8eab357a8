"""Tile sweep of the attention projection kernels (`hf_sparse_verify.kernels.qkv_rope`): ``qkv_proj`` and
``row_linear`` on the Llama-3.1-8B and Qwen3-30B-A3B attention shapes at 1 and 16 rows, each setting timed as a
CUDA graph (``bench_kernels.time_case``), against ``F.linear`` (cuBLAS) and the weights' bytes at the measured copy
bandwidth. Prints the best setting of each kernel (sum over shapes and rows); `kernel.TILES` is set by hand from it.

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
from hf_sparse_verify.kernels.qkv_rope import qkv_proj, row_linear
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
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    cases = []
    for name, (hidden, heads_q, heads_kv, dim, _) in SHAPES.items():
        ws = [
            torch.randn(h * dim, hidden, device=device, dtype=dtype) * 0.02
            for h in (heads_q, heads_kv, heads_kv)
        ]
        w_o = torch.randn(hidden, heads_q * dim, device=device, dtype=dtype) * 0.02
        for rows in ROWS:
            x = torch.randn(rows, hidden, device=device, dtype=dtype)
            a = torch.randn(rows, heads_q * dim, device=device, dtype=dtype)
            cases.append((name, rows, x, ws, a, w_o))
    saved = dict(qkv_kernel.TILES)
    result = dict(
        machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1), baseline=[], trials=[]
    )
    for name, rows, x, ws, a, w_o in cases:
        qkv_bytes = sum(w.numel() for w in ws) * 2
        result["baseline"].append(dict(
            shape=name, rows=rows, qkv_torch_us=round(_time(functools.partial(_three, x, ws), device), 2),
            out_torch_us=round(_time(functools.partial(F.linear, a, w_o), device), 2),
            qkv_floor_us=round(1e6 * qkv_bytes / bandwidth, 2), out_floor_us=round(1e6 * w_o.numel() * 2 / bandwidth, 2),
        ))  # fmt: skip
    grid = list(itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 4)))
    best = {}
    with tqdm(total=len(grid), desc="qkv_rope tiles", file=sys.stderr) as bar:
        for n, k, warps, stages in grid:
            qkv_kernel.TILES.update(proj_n=n, proj_k=k, num_warps=warps, num_stages=stages, out_n=n, out_k=k,
                                    out_warps=warps)  # fmt: skip
            try:
                qkv = sum(_time(functools.partial(qkv_proj, x, *ws), device) for _, _, x, ws, _, _ in cases)
                out = sum(
                    _time(functools.partial(row_linear, a, w_o), device) for _, _, _, _, a, w_o in cases
                )
            except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                result["trials"].append(dict(tiles=[n, k, warps, stages], error=repr(err)[:200]))
                bar.update(1)
                continue
            result["trials"].append(
                dict(tiles=[n, k, warps, stages], qkv_us=round(qkv, 2), out_us=round(out, 2))
            )
            for kind, us in (("qkv", qkv), ("out", out)):
                if us < best.get(kind, (float("inf"),))[0]:
                    best[kind] = (us, [n, k, warps, stages])
            bar.update(1)
    qkv_kernel.TILES.clear()
    qkv_kernel.TILES.update(saved)
    result["best"] = {
        kind: dict(sum_us=round(v[0], 2), tiles_n_k_warps_stages=v[1]) for kind, v in best.items()
    }
    print(json.dumps(result["baseline"], indent=1))
    print("default", saved, "best", json.dumps(result["best"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
