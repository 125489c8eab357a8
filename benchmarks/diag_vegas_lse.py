"""Verify-step attention at the self-speculation shape (Llama-3.1-8B heads, bf16): no scores, Vegas softmax-weight
scores normalised by each row's own log-sum-exp (``step``: stored logits, weights pass), and by the carried
log-sum-exp summed in the split kernel (``carried``, as a 16-row dot or a row reduction). CUDA-graph timing.

``python benchmarks/diag_vegas_lse.py --json benchmarks/results/h200_diag_vegas_lse.json``
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton.testing

from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.decode_attention import kernel as da_kernel

HEADS, KV_HEADS, DIM = 32, 8, 128


def _time(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=200) * 1000  # us


def _carried(step, carried: torch.Tensor, dot: bool, weight_tiles: bool):
    da_kernel.CARRIED_DOT, da_kernel.CARRIED_WEIGHT_TILES = dot, weight_tiles
    try:
        return step(carried_lse=carried)
    finally:
        da_kernel.CARRIED_DOT, da_kernel.CARRIED_WEIGHT_TILES = True, True


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["4x65536x7", "16x16384x7", "4x65536x5"])
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda")
    records = []
    for case in args.cases:
        batch, context, q_len = (int(x) for x in case.split("x"))
        gen = torch.Generator(device).manual_seed(0)
        key = torch.randn(batch, KV_HEADS, context, DIM, device=device, generator=gen, dtype=torch.bfloat16)
        value = torch.randn_like(key)
        query = torch.randn(batch, HEADS, q_len, DIM, device=device, generator=gen, dtype=torch.bfloat16)
        start = torch.full((batch,), context - q_len, device=device)
        pad = torch.zeros(batch, dtype=torch.long, device=device)
        carried = torch.full((batch, HEADS), 5.0, device=device)
        args_ = (query, key, value, start, pad, DIM**-0.5)

        step = functools.partial(decode_attention, *args_, collect="two_rows", weights=True)
        variants = {
            "none": functools.partial(decode_attention, *args_),
            "step": step,
            "carried_dot": functools.partial(_carried, step, carried, True, False),
            "carried_rowsum": functools.partial(_carried, step, carried, False, False),
            "carried_dot_2stages": functools.partial(_carried, step, carried, True, True),
            "carried_rowsum_2stages": functools.partial(_carried, step, carried, False, True),
        }
        record = dict(batch=batch, context=context, q_len=q_len)
        for name, fn in variants.items():
            record[f"{name}_us"] = round(_time(fn), 1)
        records.append(record)
        print(json.dumps(record), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine_info(device), records=records), f, indent=1)


if __name__ == "__main__":
    main()
