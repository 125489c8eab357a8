"""Tile sweep of the sparse FFN kernels (`hf_sparse_verify.kernels.sparse_ffn`: `sparse_gate_up` + `masked_down`) on
the Llama-3.1-8B MLP, against the dense MLP a verify step runs (`gated_act` + ``F.linear`` up to 16 token rows, else
three ``F.linear``), each timed as a CUDA graph (``bench_kernels.time_case``), beside the bytes a sparse step must read
at the measured copy bandwidth. Each setting changes a few of `kernel.TILES`; each launch of the fused sparse MLP
(gate and mask, channel list, up, down) is timed alone and the whole, and the best per case is printed;
`kernel.TILES` is set by hand from it. ``--previous FILE`` times an earlier ``kernel.py`` beside it.

``python benchmarks/sweep_sparse_ffn.py`` (record ``tiles`` of ``results/sweep_sparse_ffn.json``)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_kernels import time_case
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.kernels.sparse_ffn import kernel as ffn_kernel
from hf_sparse_verify.kernels.sparse_ffn import sparse_ffn
from hf_sparse_verify.kernels.sparse_ffn.bench import HIDDEN, INTER, QUICK, _dense_step_mlp, _weights, tau_for

#: settings tried, each a change from `kernel.TILES` (and ``DOWN_PROGRAMS``): one key at a time, then a few pairs.
#: Every kernel is timed for every setting; the gate keys only change the gate kernel, and so on
SINGLE = {
    "gate_n": (64,),
    "gate_k": (256,),
    "gate_warps": (2, 8),
    "gate_stages": (4,),
    "up_n": (16, 64),
    "up_k": (256,),
    "up_warps": (2,),
    "down_n": (128,),
    "down_s": (64,),
    "down_warps": (2, 8),
    "down_stages": (4,),
    "DOWN_PROGRAMS": (256, 1024),
}
VARIANTS = [{key: value} for key, values in SINGLE.items() for value in values] + [
    {"gate_n": 64, "gate_warps": 8},
    {"gate_k": 256, "gate_warps": 8},
    {"up_n": 64, "up_warps": 8},
]
#: the second sweep (after the first chose the defaults): the channel list in one block, deeper up / down pipelines
VARIANTS_2 = [
    {"up_split": 1}, {"up_split": 2}, {"up_split": 8}, {"up_split": 8, "up_k": 64}, {"up_split": 4, "up_n": 16},
    {"list_block": 16384}, {"list_block": 16384, "list_warps": 8}, {"list_block": 16384, "list_warps": 16},
    {"list_block": 8192, "list_warps": 8}, {"list_warps": 8},
    {"up_k": 256, "up_stages": 4}, {"up_n": 16, "up_k": 256}, {"up_n": 16, "up_k": 256, "up_stages": 4},
    {"up_n": 16, "up_stages": 5}, {"up_k": 512, "up_stages": 2},
    {"down_n": 128, "down_s": 64, "down_stages": 4}, {"down_stages": 5}, {"down_s": 256, "down_stages": 2},
    {"DOWN_PROGRAMS": 384},
]  # fmt: skip


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


def _parts(x, w_gate, w_up, w_down_t, tau, device) -> dict:
    """Each launch of the fused sparse MLP timed alone, and the whole."""
    h, keep = ffn_kernel._gate_keep(x, w_gate, tau)
    channels = ffn_kernel.kept_channels_launch(keep)
    hc = ffn_kernel._compact_up(x, w_up, h, channels, compact_out=True)
    return dict(
        gate_us=_time(functools.partial(ffn_kernel._gate_keep, x, w_gate, tau), device),
        list_us=_time(functools.partial(ffn_kernel.kept_channels_launch, keep), device),
        up_us=_time(functools.partial(ffn_kernel._compact_up, x, w_up, h.clone(), channels, True), device),
        down_us=_time(functools.partial(ffn_kernel._compact_down, hc, w_down_t, channels, True), device),
        whole_us=_time(
            functools.partial(ffn_kernel.sparse_ffn_launch, x, w_gate, w_up, w_down_t, tau), device
        ),
    )


def _load_old(path: str):
    """A previous version of `kernel.py` (for example ``git show REV:hf_sparse_verify/kernels/sparse_ffn/kernel.py``)
    as a module of the same package, to time its ``sparse_gate_up_launch`` + ``masked_down_launch`` side by side."""
    name = "hf_sparse_verify.kernels.sparse_ffn._previous_kernel"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _old_whole(old, x, w_gate, w_up, w_down_t, tau):
    h, keep = old.sparse_gate_up_launch(x, w_gate, w_up, tau)
    return old.masked_down_launch(h, w_down_t, keep)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=["1x16", "8x16"], help="BATCHxTOKENS verify rows")
    parser.add_argument("--skipped", nargs="+", type=float, default=[0.0, 0.5, 0.75, 1.0])
    parser.add_argument(
        "--variants",
        nargs="+",
        help="settings to try instead of VARIANTS, e.g. down_s=256 down_n=128,down_s=128; 'none' for none, "
        "'second' for VARIANTS_2",
    )
    parser.add_argument("--previous", help="a previous kernel.py to time side by side (see _load_old)")
    _records.add_arguments(parser, "sweep_sparse_ffn")
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
        variants = [] if args.variants == ["none"] else VARIANTS_2 if args.variants == ["second"] else [
            {k: int(v) for k, v in (kv.split("=") for kv in item.split(","))} for item in args.variants
        ]  # fmt: skip
    old = _load_old(args.previous) if args.previous else None
    cases = [(tuple(int(v) for v in r.split("x")), s) for r in args.rows for s in args.skipped]
    records = []
    total = len(cases) * (1 + len(variants))
    with tqdm(total=total, desc="sparse ffn tiles", file=sys.stderr) as bar:
        for (batch, q_len), skipped in cases:
            x = torch.randn(batch, q_len, hidden, device=device, dtype=dtype)
            tau = (
                tau_for(x, w_gate, skipped) if 0 < skipped < 1 else torch.tensor(1e9 * skipped, device=device)
            )
            _, keep = ffn_kernel._gate_keep(x, w_gate, tau)
            used = int(keep.bool().any(0).sum())
            common = dict(
                batch=batch, q_len=q_len, skipped=skipped, used_channels=used,
                gate_floor_us=inter * hidden * size / bandwidth * 1e6,
                up_floor_us=used * hidden * size / bandwidth * 1e6,
                down_floor_us=used * hidden * size / bandwidth * 1e6,
                dense_us=_time(functools.partial(_dense_step_mlp, x, w_gate, w_up, w_down), device),
                op_us=_time(functools.partial(sparse_ffn, x, w_gate, w_up, w_down_t, tau), device),
            )  # fmt: skip
            if old is not None:
                run = functools.partial(_old_whole, old, x, w_gate, w_up, w_down_t, tau)
                common["previous_us"] = _time(run, device)
            records.append(dict(common, setting="default", **_parts(x, w_gate, w_up, w_down_t, tau, device)))
            bar.update(1)
            for change in variants:
                with _settings(change):
                    name = ",".join(f"{k}={v}" for k, v in change.items())
                    records.append(
                        dict(common, setting=name, **_parts(x, w_gate, w_up, w_down_t, tau, device))
                    )
                bar.update(1)
            mine = [r for r in records if (r["batch"], r["q_len"], r["skipped"]) == (batch, q_len, skipped)]
            best = {part: min(mine, key=lambda r, p=part: r[p]) for part in ("gate_us", "up_us", "down_us")}
            floor = common["gate_floor_us"] + common["up_floor_us"] + common["down_floor_us"]
            print(
                f"{batch}x{q_len} skip {skipped} ({used} of {inter} channels used): dense MLP "
                f"{common['dense_us']:.1f} us, previous kernels {common.get('previous_us', float('nan')):.1f}, "
                f"sparse {mine[0]['whole_us']:.1f} (floor {floor:.1f}) = gate {mine[0]['gate_us']:.1f} + list "
                f"{mine[0]['list_us']:.1f} + up {mine[0]['up_us']:.1f} + down {mine[0]['down_us']:.1f}; best "
                + ", ".join(f"{p} {r['setting']} {r[p]:.1f}" for p, r in best.items()),
                flush=True,
            )
    if args.json:
        _records.save(args, dict(machine=machine_info(device), tiles=dict(ffn_kernel.TILES),
                           down_programs=ffn_kernel.DOWN_PROGRAMS, records=records), device, setting="tiles")  # fmt: skip


if __name__ == "__main__":
    main()
