"""KV cache layout against the attention kernels (Llama-3.1-8B heads, bf16): the cache stored head-major
(``[B, H_kv, C, D]`` contiguous, one 256-byte row per slot and KV head, 32 MiB apart per head at 64K) or slot-major
(``[B, C, H_kv, D]`` storage seen as ``[B, H_kv, C, D]``: a slot's KV heads side by side, 2 KiB per slot). The
kernels take strides, so both run unchanged.

Cases per layout, us per layer (``LAYERS`` separate caches in turn, so the L2 does not hold the next call's bytes):
the token-sparse draft attention (one new token, 7% of the prefix selected, sorted, plus 64 recent slots), and the
split-KV attention of a decode step (1 token) and of a 7-token verify with and without Vegas' softmax-weight scores.

``python benchmarks/diag_kv_layout.py --json out.json [--cases 4x65536]``
"""

from __future__ import annotations

import argparse
import functools
import json
import math

import torch

from benchmarks.bench_kernels import time_layers
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.token_sparse.kernel import token_sparse_attention_triton

HEADS, KV_HEADS, DIM = 32, 8, 128
LAYERS = 4
RATIO, RECENT = 0.07, 64


def _cache(batch: int, capacity: int, layout: str, gen: torch.Generator) -> torch.Tensor:
    if layout == "head":
        return torch.randn(batch, KV_HEADS, capacity, DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    storage = torch.randn(batch, capacity, KV_HEADS, DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    return storage.transpose(1, 2)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["4x65536", "16x16384"])
    parser.add_argument("--json")
    parser.add_argument("--draft-only", action="store_true", help="only the token-sparse draft kernels")
    parser.add_argument("--layouts", nargs="+", default=["head", "slot"])
    args = parser.parse_args()
    records = []
    bandwidth = copy_bandwidth(torch.device("cuda"))
    for case in args.cases:
        batch, context = (int(x) for x in case.split("x"))
        capacity = context + 16
        for layout in args.layouts:
            gen = torch.Generator("cuda").manual_seed(0)
            caches = [
                (_cache(batch, capacity, layout, gen), _cache(batch, capacity, layout, gen))
                for _ in range(LAYERS)
            ]
            n_index = math.ceil(RATIO * (context - RECENT))
            index = torch.stack(
                [
                    torch.randperm(context - RECENT, device="cuda", generator=gen)[:n_index].sort().values
                    for _ in range(batch)
                ]
            ).to(torch.int32)
            count = torch.full((batch,), n_index, dtype=torch.int32, device="cuda")
            pad = torch.zeros(batch, dtype=torch.long, device="cuda")
            names = [("draft_token_sparse", 1)]
            if not args.draft_only:
                names += [("decode", 1), ("verify7", 7), ("verify7_vegas_step", 7)]
            for name, q_len in names:
                query = torch.randn(
                    batch, HEADS, q_len, DIM, generator=gen, device="cuda", dtype=torch.bfloat16
                )
                start = torch.full((batch,), context - q_len, device="cuda")
                if name == "draft_token_sparse":
                    recent = torch.full((batch,), context - RECENT, device="cuda")
                    fns = [
                        functools.partial(
                            token_sparse_attention_triton, query, k, v, index, count, recent, start, DIM**-0.5
                        )
                        for k, v in caches
                    ]
                    kv_bytes = batch * (n_index + RECENT) * KV_HEADS * DIM * 2 * 2
                else:
                    extra = dict(collect="two_rows", weights=True) if name.endswith("vegas_step") else {}
                    fns = [
                        functools.partial(decode_attention, query, k, v, start, pad, DIM**-0.5, **extra)
                        for k, v in caches
                    ]
                    kv_bytes = batch * context * KV_HEADS * DIM * 2 * 2
                us = time_layers(fns)
                floor = kv_bytes / bandwidth * 1e6
                records.append(
                    dict(case=case, layout=layout, kernel=name, us=round(us, 2), floor_us=round(floor, 2))
                )
                print(records[-1], flush=True)
            del caches
            torch.cuda.empty_cache()
    out = dict(
        machine=machine_info(torch.device("cuda")),
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
        records=records,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
