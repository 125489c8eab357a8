"""Launch-setting sweep of `_weights_kernel` (Vegas' softmax weights from the stored logits of a verify step,
`hf_sparse_verify.kernels.decode_attention`) at the long-context verify shapes (Llama-3.1-8B heads, bf16, 7 new
tokens, first and last rows scored, the head mean): the whole ``decode_attention(..., collect="two_rows",
weights=True)`` op is timed as a CUDA graph over ``LAYERS`` separate caches in turn, so settings differ only in the
weights kernel; the same op without scores is timed beside it. `kernel.WEIGHTS_TILES` is set by hand from it.

``python benchmarks/sweep_vegas_weights.py --json out.json [--cases 4x65536 16x16384]``
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_kernels import time_layers
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.decode_attention import kernel as da_kernel

HEADS, KV_HEADS, DIM, Q_LEN = 32, 8, 128, 7
LAYERS = 4


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["4x65536", "16x16384"])
    parser.add_argument("--block-n", nargs="*", type=int, default=[32, 64, 128, 256])
    parser.add_argument("--warps", nargs="*", type=int, default=[1, 2, 4, 8])
    _records.add_arguments(parser, "sweep_vegas_weights")
    args = parser.parse_args()
    device = torch.device("cuda")
    default = dict(da_kernel.WEIGHTS_TILES)
    records = []
    for case in args.cases:
        batch, context = (int(x) for x in case.split("x"))
        gen = torch.Generator(device).manual_seed(0)
        shape = (batch, KV_HEADS, context + 16, DIM)
        caches = [
            (
                torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16),
                torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16),
            )
            for _ in range(LAYERS)
        ]
        query = torch.randn(batch, HEADS, Q_LEN, DIM, generator=gen, device=device, dtype=torch.bfloat16)
        start = torch.full((batch,), context - Q_LEN, device=device)
        pad = torch.zeros(batch, dtype=torch.long, device=device)
        scored = [
            functools.partial(
                decode_attention, query, k, v, start, pad, DIM**-0.5, collect="two_rows", weights=True
            )
            for k, v in caches
        ]
        plain = [functools.partial(decode_attention, query, k, v, start, pad, DIM**-0.5) for k, v in caches]
        reference = scored[0]()[1]
        records.append(dict(case=case, variant="no_scores", us=round(time_layers(plain), 2)))
        grid = list(itertools.product(args.block_n, args.warps))
        for block_n, warps in tqdm([(default["block_n"], default["num_warps"]), *grid], desc=case):
            da_kernel.WEIGHTS_TILES.update(block_n=block_n, num_warps=warps)
            try:
                error = (scored[0]()[1] - reference).abs().max().item()
                us = time_layers(scored)
            finally:
                da_kernel.WEIGHTS_TILES.update(default)
            records.append(
                dict(case=case, variant="scores", block_n=block_n, num_warps=warps, us=round(us, 2),
                     max_score_diff=error)
            )  # fmt: skip
            print(records[-1], flush=True)
        del caches
        torch.cuda.empty_cache()
    best = {}
    for r in records:
        if r["variant"] == "scores":
            key = (r["block_n"], r["num_warps"])
            best[key] = best.get(key, 0.0) + r["us"]
    choice = min(best, key=best.get)
    out = dict(
        machine=machine_info(device), default=default, records=records,
        best=dict(block_n=choice[0], num_warps=choice[1]),
    )  # fmt: skip
    print("best over the cases:", out["best"])
    if args.json:
        _records.save(args, out, device, setting="tiles")


if __name__ == "__main__":
    main()
