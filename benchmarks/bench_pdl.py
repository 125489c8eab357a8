"""Does programmatic dependent launch (PDL) shorten a CUDA graph of small Triton kernels on this GPU?

A chain of 48 one-row RMSNorms, of 48 one-row GEMVs (2048 x 2048 bf16, a different weight each, so no L2 reuse),
and of the two alternating, each captured in one CUDA graph and replayed: without PDL, with PDL (each kernel
waits for the previous one first, then lets the next launch), and for the GEMVs with PDL plus a first weight tile
loaded before the wait (weights are never written, so reading them early is safe). Every variant's result is
checked bitwise against the first. The library's kernels use the second form (`hf_sparse_verify.kernels._triton.
pdl_wait`).

``python benchmarks/bench_pdl.py --json pdl.json`` (needs a CUDA GPU of compute capability 9.0 or newer)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

import torch
import triton
import triton.language as tl
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.machine import machine_info

HIDDEN, LAYERS = 2048, 48


@triton.jit
def _norm_kernel(X, W, Y, N: tl.constexpr, PDL: tl.constexpr):
    offs = tl.arange(0, N)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    w = tl.load(W + offs).to(tl.float32)
    x = tl.load(X + offs).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x) / N + 1e-6)
    tl.store(Y + offs, (x * r * w).to(Y.dtype.element_ty))


@triton.jit
def _gemv_kernel(
    X, W, Y, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    if PREFETCH:  # the first weight tile before the wait
        w0 = tl.load(W + rn[:, None] * K + rk[None, :])
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    start = 0
    if PREFETCH:
        acc += tl.sum(w0.to(tl.float32) * tl.load(X + rk).to(tl.float32)[None, :], 1)
        start = BLOCK_K
    for k in range(start, K, BLOCK_K):
        w = tl.load(W + rn[:, None] * K + (k + rk)[None, :])
        acc += tl.sum(w.to(tl.float32) * tl.load(X + k + rk).to(tl.float32)[None, :], 1)
    tl.store(Y + rn, acc.to(Y.dtype.element_ty))


def _chain(kinds, mode, weights, norm_weight, buffers) -> None:
    pdl = mode != "off"
    launch = {"launch_pdl": True} if pdl else {}
    a, b = buffers
    for layer in range(LAYERS):
        if "norm" in kinds:
            _norm_kernel[(1,)](a, norm_weight, b, N=HIDDEN, PDL=pdl, **launch)
            a, b = b, a
        if "gemv" in kinds:
            _gemv_kernel[(HIDDEN // 16,)](
                a, weights[layer], b, K=HIDDEN, BLOCK_N=16, BLOCK_K=256, PDL=pdl, PREFETCH=mode == "pdl_prefetch",
                **launch,
            )  # fmt: skip
            a, b = b, a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    _records.add_arguments(parser, "pdl")
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    weights = [torch.randn(HIDDEN, HIDDEN, device=device, dtype=torch.bfloat16) / 45 for _ in range(LAYERS)]
    norm_weight = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
    buffers = [torch.empty(1, HIDDEN, device=device, dtype=torch.bfloat16) for _ in range(2)]
    start = torch.linspace(-1, 1, HIDDEN, device=device, dtype=torch.bfloat16).view(1, HIDDEN)
    cases = [(kinds, mode) for kinds in (("norm",), ("gemv",), ("norm", "gemv")) for mode in ("off", "pdl")]
    cases += [(("gemv",), "pdl_prefetch"), (("norm", "gemv"), "pdl_prefetch")]
    records, reference = [], {}
    for _round in tqdm(range(2), desc="pdl", file=sys.stderr):  # two interleaved rounds: drift shows
        for kinds, mode in cases:
            buffers[0].copy_(start)
            _chain(kinds, mode, weights, norm_weight, buffers)  # compile
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                _chain(kinds, mode, weights, norm_weight, buffers)
            buffers[0].copy_(start)
            graph.replay()
            result = buffers[(LAYERS * len(kinds)) % 2].clone()
            same = bool(torch.equal(reference.setdefault(kinds, result), result))
            for _ in range(20):
                graph.replay()
            times = []
            for _ in range(args.repeats):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(10):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                times.append(begin.elapsed_time(end) * 100)  # us per replay
            us = median(times)
            kernels = LAYERS * len(kinds)
            records.append(dict(
                chain="+".join(kinds), mode=mode, kernels=kernels, us_per_graph=round(us, 2),
                us_per_kernel=round(us / kernels, 3), same_result_as_first=same,
            ))  # fmt: skip
    for r in records:
        print(f"{r['chain']:>10} {r['mode']:>13}: {r['us_per_graph']:8.1f} us per graph, "
              f"{r['us_per_kernel']:.2f} us per kernel, same result {r['same_result_as_first']}")  # fmt: skip
    if args.json:
        _records.save(args, dict(machine=machine_info(device), method=__doc__.split("\n\n")[1].replace("\n", " "),
                           records=records), device, setting="chains")  # fmt: skip


if __name__ == "__main__":
    main()
