"""Tile sweep of the sparse FFN kernels (`hf_sparse_verify.kernels.sparse_ffn`: `sparse_gate_up` + `masked_down`) on
the Llama-3.1-8B MLP, against the dense MLP a verify step runs (`gated_act` + ``F.linear`` up to 16 token rows, else
three ``F.linear``), each timed as a CUDA graph (``bench_kernels.time_case``), beside the bytes a sparse step must read
at the measured copy bandwidth. Each setting changes a few of `kernel.TILES`; both kernels are timed
alone, and the best per case is printed; `kernel.TILES` is set by hand from it.

``python benchmarks/sweep_sparse_ffn.py --json benchmarks/results/sweeps/h200_sparse_ffn_tiles.json``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks.bench_kernels import time_case
from hf_sparse_verify.bench.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.sparse_ffn import kernel as ffn_kernel
from hf_sparse_verify.kernels.sparse_ffn import sparse_ffn
from hf_sparse_verify.kernels.sparse_ffn.bench import HIDDEN, INTER, QUICK, _dense_step_mlp, _weights, tau_for

#: settings tried, each a change from `kernel.TILES` (and ``DOWN_PROGRAMS``): one key at a time, then a few pairs.
#: Both kernels are timed for every setting; the gate/up keys only change `sparse_gate_up`, the down keys `masked_down`
SINGLE = {
    "sparse_n": (16, 64),
    "sparse_k": (64, 256),
    "sparse_warps": (2, 8),
    "sparse_stages": (2, 4, 5),
    "down_n": (32, 128, 256),
    "down_s": (32, 128),
    "down_warps": (2, 8),
    "down_stages": (2, 4, 5),
    "DOWN_PROGRAMS": (256, 1024, 2048),
}
VARIANTS = [{key: value} for key, values in SINGLE.items() for value in values] + [
    {"sparse_n": 64, "sparse_stages": 4},
    {"sparse_n": 64, "sparse_warps": 8},
    {"sparse_k": 256, "sparse_warps": 8},
    {"sparse_k": 256, "sparse_warps": 8, "sparse_stages": 2},
    {"down_n": 128, "down_warps": 8},
    {"down_n": 128, "down_stages": 4},
    {"down_n": 128, "DOWN_PROGRAMS": 1024},
]


@contextlib.contextmanager
def _settings(change: dict):
    saved_tiles, saved_programs = dict(ffn_kernel.TILES), ffn_kernel.DOWN_PROGRAMS
    ffn_kernel.TILES.update({k: v for k, v in change.items() if k != "DOWN_PROGRAMS"})
    ffn_kernel.DOWN_PROGRAMS = change.get("DOWN_PROGRAMS", saved_programs)
    try:
        yield
    finally:
        ffn_kernel.TILES.clear()
        ffn_kernel.TILES.update(saved_tiles)
        ffn_kernel.DOWN_PROGRAMS = saved_programs


def _time(fn, device) -> float:
    return time_case(fn, device, quick=False)[0] * 1e6


def _pair(gate_up, down, device) -> dict:
    return dict(gate_up_us=_time(gate_up, device), down_us=_time(down, device))


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["1x16", "8x16"], help="BATCHxTOKENS verify rows")
    parser.add_argument("--skipped", nargs="+", type=float, default=[0.0, 0.5, 0.75, 1.0])
    parser.add_argument(
        "--variants",
        nargs="+",
        help="settings to try instead of VARIANTS, e.g. down_s=256 down_n=128,down_s=128",
    )
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="small sizes, any device (smoke run)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    hidden, inter = QUICK if args.quick else (HIDDEN, INTER)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    w_gate, w_up, w_down = _weights(hidden, inter, device, dtype)
    w_down_t = w_down.T.contiguous()
    bandwidth = copy_bandwidth(device, megabytes=1024 if device.type == "cuda" else 16)
    size = w_gate.element_size()
    variants = VARIANTS
    if args.variants:
        variants = [
            {k: int(v) for k, v in (kv.split("=") for kv in item.split(","))} for item in args.variants
        ]
    cases = [(tuple(int(v) for v in r.split("x")), s) for r in args.rows for s in args.skipped]
    records = []
    total = len(cases) * (4 + len(variants))
    with tqdm(total=total, desc="sparse ffn tiles", file=sys.stderr) as bar:
        for (batch, q_len), skipped in cases:
            x = torch.randn(batch, q_len, hidden, device=device, dtype=dtype)
            tau = (
                tau_for(x, w_gate, skipped) if 0 < skipped < 1 else torch.tensor(1e9 * skipped, device=device)
            )
            h, keep = ffn_kernel.sparse_gate_up_launch(x, w_gate, w_up, tau)
            used = int(keep.bool().any(0).sum())
            base = dict(batch=batch, q_len=q_len, skipped=skipped, used_channels=used)
            gate_up = functools.partial(ffn_kernel.sparse_gate_up_launch, x, w_gate, w_up, tau)
            down = functools.partial(ffn_kernel.masked_down_launch, h, w_down_t, keep)
            floors = dict(
                gate_up_floor_us=(inter + used) * hidden * size / bandwidth * 1e6,
                down_floor_us=used * hidden * size / bandwidth * 1e6,
            )
            dense_us = _time(functools.partial(_dense_step_mlp, x, w_gate, w_up, w_down), device)
            cublas_down_us = _time(functools.partial(F.linear, h, w_down), device)
            whole_us = _time(functools.partial(sparse_ffn, x, w_gate, w_up, w_down_t, tau), device)
            bar.update(3)

            common = dict(base, **floors, dense_us=dense_us, cublas_down_us=cublas_down_us)
            records.append(dict(common, setting="default", **_pair(gate_up, down, device), whole_us=whole_us))
            bar.update(1)
            for change in variants:
                with _settings(change):
                    name = ",".join(f"{k}={v}" for k, v in change.items())
                    records.append(dict(common, setting=name, **_pair(gate_up, down, device)))
                bar.update(1)
            mine = [r for r in records if (r["batch"], r["q_len"], r["skipped"]) == (batch, q_len, skipped)]
            best_up = min(mine, key=lambda r: r["gate_up_us"])
            best_down = min(mine, key=lambda r: r["down_us"])
            print(
                f"{batch}x{q_len} skip {skipped} ({used} of {inter} channels used): dense MLP {dense_us:.1f} us "
                f"(cuBLAS down {cublas_down_us:.1f}); sparse {whole_us:.1f} = gate/up {mine[0]['gate_up_us']:.1f} "
                f"(floor {floors['gate_up_floor_us']:.1f}, best {best_up['setting']} {best_up['gate_up_us']:.1f}) + "
                f"down {mine[0]['down_us']:.1f} (floor {floors['down_floor_us']:.1f}, best {best_down['setting']} "
                f"{best_down['down_us']:.1f})",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=machine_info(device), tiles=dict(ffn_kernel.TILES),
                           down_programs=ffn_kernel.DOWN_PROGRAMS, records=records), f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
