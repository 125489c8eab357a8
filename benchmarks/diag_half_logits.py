"""Vegas verify scores with float16 against float32 stored logits (`decode_attention.kernel.HALF_LOGITS`) at the
long-context shapes (Llama-3.1-8B heads, bf16, a 7-token verify, ``vegas_lse="step"``): us per layer, CUDA-graph
timing over ``LAYERS`` separate caches in turn, the variants interleaved over ``--rounds`` rounds, the same verify
without scores for reference; and how far the scores and their top 7% move.

``python benchmarks/diag_half_logits.py --json out.json [--cases 4x65536 16x16384]``
"""

from __future__ import annotations

import argparse
import functools
import json
import math

import torch
import triton.testing

from hf_sparse_verify.bench.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.decode_attention import kernel as da_kernel

HEADS, KV_HEADS, DIM = 32, 8, 128
LAYERS = 4
RATIO = 0.07


def _time_layers(fns) -> float:
    def run():
        for fn in fns:
            fn()

    run()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(run, rep=300) * 1000 / len(fns)  # us per layer


def _with(module, name: str, value, fns) -> float:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        return _time_layers(fns)
    finally:
        setattr(module, name, saved)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["4x65536", "16x16384"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
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
        pad = torch.zeros(batch, dtype=torch.long, device=device)

        q7 = torch.randn(batch, HEADS, 7, DIM, generator=gen, device=device, dtype=torch.bfloat16)
        start7 = torch.full((batch,), context - 7, device=device)
        verify = [
            functools.partial(
                decode_attention, q7, k, v, start7, pad, DIM**-0.5, collect="two_rows", weights=True
            )
            for k, v in caches
        ]
        plain = [functools.partial(decode_attention, q7, k, v, start7, pad, DIM**-0.5) for k, v in caches]
        cache_bytes = batch * context * KV_HEADS * DIM * 2 * 2
        for round_ in range(args.rounds):
            for flag in (False, True):
                us = _with(da_kernel, "HALF_LOGITS", flag, verify)
                records.append(
                    dict(case=case, round=round_, kernel="verify7_vegas_step", half_logits=flag, us=round(us, 2),
                         floor_us=round(cache_bytes / bandwidth * 1e6, 2))
                )  # fmt: skip
                print(records[-1], flush=True)
            us = _time_layers(plain)
            records.append(
                dict(case=case, round=round_, kernel="verify7_no_scores", us=round(us, 2),
                     floor_us=round(cache_bytes / bandwidth * 1e6, 2))
            )  # fmt: skip
            print(records[-1], flush=True)
        # the two variants' outputs and scores side by side
        outs = {}
        for flag in (False, True):
            da_kernel.HALF_LOGITS = flag
            outs[flag] = verify[0]()
        da_kernel.HALF_LOGITS = True
        d_out = (outs[True][0].float() - outs[False][0].float()).abs().max().item()
        s_old, s_new = outs[False][1], outs[True][1]
        top = math.ceil(RATIO * context)
        kept_old = s_old.topk(top, dim=-1).indices.sort(dim=-1).values
        kept_new = s_new.topk(top, dim=-1).indices.sort(dim=-1).values
        overlap = sum(
            len(set(a.tolist()) & set(b.tolist())) for a, b in zip(kept_old, kept_new, strict=True)
        ) / (batch * top)
        records.append(
            dict(case=case, output_max_diff=d_out,
                 score_max_rel_diff=((s_new - s_old).abs().max() / s_old.abs().max()).item(),
                 top_7pct_overlap=round(overlap, 5))
        )  # fmt: skip
        print(records[-1], flush=True)
        del caches
        torch.cuda.empty_cache()
    out = dict(machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1), records=records)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
