"""Time every kernel in the benchmark registry (`hf_sparse_verify.kernels.bench_registry`) against the measured copy
bandwidth: achieved GB/s = bytes_moved / median time, and its share of the copy bandwidth.

Run on a GPU: ``python benchmarks/bench_kernels.py`` (record ``all`` of ``results/kernels.json``); ``--quick`` for a
smoke run of small sizes (also on CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info, median
from hf_sparse_verify.kernels.bench_registry import load_all

#: launches per captured graph when timing on CUDA
CALLS_PER_GRAPH = 20


def time_case(run, device: torch.device, quick: bool) -> tuple[float, str]:
    """Median seconds per call and how it was timed. On CUDA the launches are captured in a CUDA graph
    (`CALLS_PER_GRAPH` calls) and the graph's replays are timed, so host-side launch overhead (Python, custom-op
    dispatch), which the engine's captured steps do not pay, stays out of the kernel's time; if capture fails,
    ``triton.testing.do_bench`` times the eager calls."""
    if device.type == "cuda":
        import triton.testing

        try:
            run()  # compile outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(CALLS_PER_GRAPH):
                    run()
            ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
            return ms / 1000 / CALLS_PER_GRAPH, "cuda_graph"
        except Exception:  # some comparison paths (host-side lengths) cannot be captured
            torch.cuda.synchronize(device)
            return triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median") / 1000, "eager"
    times = []
    for _ in range(1 if quick else 3):
        begin = time.perf_counter()
        run()
        times.append(time.perf_counter() - begin)
    return median(times), "host_clock"


def time_layers(fns) -> float:
    """Median time of one replay of ``fns`` (one launch per layer, each over its own buffers so none is read from L2)
    as a CUDA graph, us per layer (CUDA only)."""
    import triton.testing

    def run():
        for fn in fns:
            fn()

    run()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(run, rep=300) * 1000 / len(fns)  # us per layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", help="registry names (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    _records.add_arguments(parser, "kernels")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    registry = load_all()
    names = args.ops or sorted(registry)
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else None
    records = []
    for name in names:
        for case in tqdm(list(registry[name](device, dtype, args.quick)), desc=name, file=sys.stderr):
            try:
                seconds, timing = time_case(case.run, device, args.quick)
            except Exception as err:  # record and go on: one broken variant must not hide the others
                records.append(dict(op=case.op, variant=case.variant, **case.params, error=repr(err)[:300]))
                continue
            gbps = case.bytes_moved / seconds / 1e9
            record = dict(
                op=case.op, variant=case.variant, **case.params, us=round(seconds * 1e6, 2),
                bytes_moved=case.bytes_moved, GBps=round(gbps, 1), timing=timing,
            )  # fmt: skip
            if bandwidth:
                record["share_of_copy"] = round(gbps * 1e9 / bandwidth, 3)
            records.append(record)
            print(json.dumps(record), flush=True)
    result = dict(
        machine=machine_info(device),
        dtype=args.dtype,
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1) if bandwidth else None,
        method=f"CUDA graph of {CALLS_PER_GRAPH} launches, median replay time (triton.testing.do_bench) / "
        f"{CALLS_PER_GRAPH}; bytes_moved = fewest bytes the launch must read and write",
        records=records,
    )
    if args.json:
        _records.save(args, result, device, setting="quick" if args.quick else "all")


if __name__ == "__main__":
    main()
