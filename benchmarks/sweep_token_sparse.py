"""Launch-setting sweep of the token-sparse draft attention kernel (`hf_sparse_verify.kernels.token_sparse`) on the
self-speculation draft shapes of `bench_long.py` (Llama-3.1-8B heads: 32 query, 8 KV, head_dim 128; random bf16
caches; 7% of the prefix selected per row, sorted, plus the recent window; one new token per row).

Every setting of ``block_n x num_warps x num_stages x programs_per_sm`` is timed as a CUDA graph
(``bench_kernels.time_case``, merge kernel included) against the gathered K/V bytes at the measured copy bandwidth.
Prints and writes the best setting over the cases; `kernel.TILES` is set by hand from it.

``python benchmarks/sweep_token_sparse.py --json out.json [--cases 4x65536 16x16384]``
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
from hf_sparse_verify.kernels.token_sparse import kernel as ts_kernel
from hf_sparse_verify.kernels.token_sparse.bench import _inputs
from hf_sparse_verify.kernels.token_sparse.kernel import token_sparse_attention_triton

HEADS, KV_HEADS, DIM = 32, 8, 128
RECENT = 64


def _run(inputs, tiles):
    saved = dict(ts_kernel.TILES)
    ts_kernel.TILES.update(tiles)
    try:
        return token_sparse_attention_triton(**inputs)
    finally:
        ts_kernel.TILES.clear()
        ts_kernel.TILES.update(saved)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _records.add_arguments(parser, "sweep_token_sparse")
    parser.add_argument("--cases", nargs="*", default=["4x65536", "16x16384"], help="batch x context")
    parser.add_argument("--q-len", type=int, default=1)
    parser.add_argument("--block-n", nargs="*", type=int, default=[32, 64, 128])
    parser.add_argument("--warps", nargs="*", type=int, default=[2, 4, 8])
    parser.add_argument("--stages", nargs="*", type=int, default=[2, 3, 4])
    parser.add_argument("--programs-per-sm", nargs="*", type=int, default=[2, 4, 8])
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    grid = [
        dict(block_n=n, num_warps=w, num_stages=s, programs_per_sm=p)
        for n, w, s, p in itertools.product(args.block_n, args.warps, args.stages, args.programs_per_sm)
    ]
    default = dict(ts_kernel.TILES)
    result = dict(
        machine=machine_info(device),
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
        default=default,
        records=[],
    )
    cases = [tuple(int(x) for x in case.split("x")) for case in args.cases]
    bar = tqdm(total=len(cases) * len(grid), desc="token_sparse tiles", file=sys.stderr)
    for batch, context in cases:
        inputs = _inputs(device, dtype, context, args.q_len, HEADS, KV_HEADS, DIM, batch=batch, recent=RECENT)
        gathered = inputs["index"].shape[1] + RECENT
        floor_us = 1e6 * batch * gathered * KV_HEADS * DIM * 2 * dtype.itemsize / bandwidth
        for tiles in grid:
            record = dict(
                batch=batch, context=context, q_len=args.q_len, floor_us=round(floor_us, 1), **tiles
            )
            try:
                record["us"] = round(
                    time_case(functools.partial(_run, inputs, tiles), device, False)[0] * 1e6, 2
                )
            except Exception as err:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                record["error"] = repr(err)[:160]
            result["records"].append(record)
            bar.update(1)
        del inputs
        torch.cuda.empty_cache()
    bar.close()
    sums: dict = {}
    for r in result["records"]:
        if "us" in r:
            sums.setdefault(tuple(r[k] for k in default), []).append(r)
    full = {k: v for k, v in sums.items() if len(v) == len(cases)}
    winner = min(full, key=lambda k: sum(r["us"] for r in full[k]))
    key_default = tuple(default.values())
    result["best"] = dict(
        best=dict(zip(default, winner)),
        per_case=[
            dict(batch=r["batch"], context=r["context"], us=r["us"], floor_us=r["floor_us"],
                 default_us=next((d["us"] for d in full.get(key_default, [])
                                  if (d["batch"], d["context"]) == (r["batch"], r["context"])), None))
            for r in full[winner]
        ],
    )  # fmt: skip
    print(json.dumps(result["best"], indent=1))
    if args.json:
        _records.save(args, result, device, setting="tiles")


if __name__ == "__main__":
    main()
