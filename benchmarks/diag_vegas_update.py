"""Times the two Vegas-only pieces of an iteration on the 8B shape (32 layers, 32 heads, 8 KV heads, 128 dims):
the selection update (`kernels/topk_slots`: chunk and warp choices of the Triton kernel against the PyTorch path
with ``torch.topk``) and the verify pass's score reduction (softmax weights averaged over KV heads in the weights
kernel against per-KV-head weights and a separate mean), per layer in microseconds, CUDA-graph replay.

    python benchmarks/diag_vegas_update.py --json results/diag_vegas_update.json
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.kernels.decode_attention.kernel import launch as attention_launch
from hf_sparse_verify.kernels.topk_slots.bench import POOL, RATIO, RECENT_SHARE, torch_topk
from hf_sparse_verify.kernels.topk_slots.kernel import topk_slots_triton
from hf_sparse_verify.kernels.topk_slots.naive import topk_slots_naive

LAYERS, HEADS, KV_HEADS, DIM = 32, 32, 8, 128


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds per call of ``fn``, replayed from a CUDA graph of ``reps`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * reps)


def selection_records(batch: int, context: int) -> list[dict]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    count = math.ceil(RATIO * context)
    dev = torch.device("cuda")
    args = dict(
        scores=torch.rand(LAYERS, batch, context, generator=gen).to(dev) * 1e-3,
        pad=torch.zeros(batch, dtype=torch.long, device=dev),
        recent_start=torch.full((batch,), context - 7, dtype=torch.long, device=dev),
        count=torch.full((batch,), count, dtype=torch.long, device=dev),
        k_slots=count,
        recent=torch.full((batch,), round(count * RECENT_SHARE), dtype=torch.long, device=dev),
        pool=POOL,
    )
    expected = topk_slots_naive(**args)
    out = []
    base = dict(part="selection", batch=batch, context=context, layers=LAYERS)
    out.append({**base, "variant": "torch_topk", "us": graph_us(lambda: torch_topk(**args))})
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            got = topk_slots_triton(**args, block=block, num_warps=warps)
            us = graph_us(lambda b=block, w=warps: topk_slots_triton(**args, block=b, num_warps=w))
            ok = bool(torch.equal(got, expected))
            out.append({**base, "variant": f"triton_b{block}_w{warps}", "us": us, "equal": ok})
    return out


def scores_records(batch: int, context: int, q_len: int = 7) -> list[dict]:
    gen = torch.Generator(device="cpu").manual_seed(1)
    dev, dt = torch.device("cuda"), torch.bfloat16
    query = torch.randn(batch, HEADS, q_len, DIM, generator=gen).to(dev, dt)
    key = torch.randn(batch, KV_HEADS, context, DIM, generator=gen).to(dev, dt)
    value = torch.randn(batch, KV_HEADS, context, DIM, generator=gen).to(dev, dt)
    start = torch.full((batch,), context - q_len, dtype=torch.long, device=dev)
    pad = torch.zeros(batch, dtype=torch.long, device=dev)
    splits = 8
    common = (query, key, value, start, pad, DIM**-0.5, 0, 1, splits, True)
    per_head = attention_launch(*common)[1].mean(dim=1)
    folded = attention_launch(*common, mean_heads=True)[1]
    base = dict(part="scores", batch=batch, context=context, q_len=q_len)
    return [
        {**base, "variant": "none", "us": graph_us(lambda: attention_launch(*common[:7], 0, splits, False))},
        {
            **base,
            "variant": "per_head_then_mean",
            "us": graph_us(lambda: attention_launch(*common)[1].mean(dim=1)),
        },
        {
            **base,
            "variant": "mean_in_weights_kernel",
            "us": graph_us(lambda: attention_launch(*common, mean_heads=True)),
            "max_abs_diff": float((folded - per_head).abs().max()),
        },
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    records = []
    for batch, context in ((16, 16384), (4, 65536), (1, 65536)):
        for r in selection_records(batch, context) + scores_records(batch, context):
            print(json.dumps(r))
            records.append(r)
    with open(args.json, "w") as f:
        json.dump({"machine": machine_info(torch.device("cuda")), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
