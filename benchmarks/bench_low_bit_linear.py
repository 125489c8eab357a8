"""The weight-only low-bit matmul of draft steps (``hsv::low_bit_linear``) on the linear shapes of a preset model,
against the bytes it reads: per (layer shape, rows, format) the median microseconds of CUDA-graph replays and the
achieved read bandwidth (stored weights + scales + activations) over the measured copy bandwidth, next to the same
layer in bf16 through ``F.linear`` (cuBLAS) and, where this torch has it, PyTorch's own int4 kernel
(``torch.ops.aten._weight_int4pack_mm``, tinygemm, group 128, asymmetric) as the alternative considered.

``--sweep`` also times our kernel at one row over a grid of launch settings (output block x input block of the
settings each format's one-row launch takes: `kernel.GEMV_TILES` for int4, `kernel.TILES` for int8) and records each
as method ``hsv_{fmt}_sweep`` with its ``tiles``.

Writes ``--json`` (default ``benchmarks/results/low_bit_linear.json``): ``records``, one per (shape, layer, rows,
method), with ``us``, ``bytes``, ``GBps``, ``of_copy_bandwidth``; a method that fails records its error.

    python benchmarks/bench_low_bit_linear.py --shape llama-3.1-8b --rows 1 2 4 8 16 64
    python benchmarks/bench_low_bit_linear.py --plot benchmarks/results/low_bit_linear.json   # redraw the PNG
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info  # noqa: E402
from hf_sparse_verify.drivers.shapes import shape_config  # noqa: E402
from hf_sparse_verify.generation.engine.graphs import capture_graph  # noqa: E402
from hf_sparse_verify.kernels.low_bit import kernel as low_bit_kernel  # noqa: E402
from hf_sparse_verify.kernels.low_bit import low_bit_linear, pack, quantize  # noqa: E402


def layers(shape: str) -> dict[str, tuple[int, int]]:
    """``name -> (out, in)`` of one decoder layer's linear layers of preset ``shape``."""
    c = shape_config(shape)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {
        "q_proj": (c.num_attention_heads * head_dim, c.hidden_size),
        "kv_proj": (c.num_key_value_heads * head_dim, c.hidden_size),
        "o_proj": (c.hidden_size, c.num_attention_heads * head_dim),
        "gate_up": (c.intermediate_size, c.hidden_size),
        "down_proj": (c.hidden_size, c.intermediate_size),
    }


def graph_us(fn, repeats: int = 50, inner: int = 20) -> float:
    """Median microseconds of one ``fn()`` from replays of a CUDA graph of ``inner`` calls."""
    def calls() -> None:
        for _ in range(inner):
            fn()

    graph, _ = capture_graph(calls, torch.device("cuda", torch.cuda.current_device()))
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / inner)
    times.sort()
    return times[len(times) // 2]


def _tinygemm(weight: torch.Tensor, group: int = 128):
    """PyTorch's int4 weight-only kernel (the layout torchao's tinygemm config uses): asymmetric int4 per group."""
    out, inp = weight.shape
    w = weight.float().view(out, inp // group, group)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-6)
    q = ((w - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out, inp)
    zero = lo + 8 * scale  # tinygemm dequantizes (q - 8) * scale + zero
    scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1).contiguous()
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, packed, group, scales_zeros.to(torch.bfloat16))


def _timed(args, name: str, out: int, inp: int, rows: int, method: str, fn, weight_bytes: int, bandwidth: float,
           **extra) -> dict:  # fmt: skip
    """One record: ``fn`` timed (`graph_us`) against the bytes it moves (weights + activations + output), or the
    error it raised."""
    try:
        us = graph_us(fn)
    except Exception as err:
        return dict(layer=name, rows=rows, method=method, **extra, error=f"{type(err).__name__}: {err}"[:300])
    moved = weight_bytes + rows * inp * 2 + rows * out * 2
    gbps = moved / us / 1e3
    return dict(
        shape=args.shape, layer=name, out=out, inp=inp, rows=rows, method=method, **extra, us=round(us, 2),
        bytes=moved, GBps=round(gbps, 1), of_copy_bandwidth=round(gbps / (bandwidth / 1e9), 3),
    )  # fmt: skip


def _quantized(weight: torch.Tensor, fmt: str, group: int):
    values, scales = quantize(weight, fmt, group)
    return pack(values, fmt), scales


def _layer_records(args, name: str, out: int, inp: int, rows: int, device, bandwidth: float) -> list[dict]:
    """Every method on one layer shape and row count."""
    weight = torch.randn(out, inp, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, inp, device=device, dtype=torch.bfloat16)
    methods = {"bf16_cublas": (lambda: F.linear(x, weight), weight.nbytes)}
    records = []
    for fmt in ("int8", "int4"):
        stored, scales = _quantized(weight, fmt, args.group_size)
        methods[f"hsv_{fmt}"] = (
            lambda s=stored, c=scales, f=fmt: low_bit_linear(x, s, c, f, args.group_size),
            stored.nbytes + scales.nbytes,
        )
    try:
        tiny = _tinygemm(weight)
        methods["torch_int4_tinygemm"] = (lambda: tiny(x), out * inp // 2 + 4 * out * (inp // 128))
    except Exception as err:  # not in this torch build, or another signature
        error = f"{type(err).__name__}: {err}"[:300]
        records.append(dict(layer=name, rows=rows, method="torch_int4_tinygemm", error=error))
    for method, (fn, weight_bytes) in methods.items():
        records.append(_timed(args, name, out, inp, rows, method, fn, weight_bytes, bandwidth))
    return records


def _sweep_records(args, name: str, out: int, inp: int, device, bandwidth: float) -> list[dict]:
    """Our kernel at one row over a grid of launch settings (output block x input block), for each format the
    settings its one-row launch takes (int4: `low_bit_kernel.GEMV_TILES`, int8: `low_bit_kernel.TILES`)."""
    weight = torch.randn(out, inp, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, inp, device=device, dtype=torch.bfloat16)
    records = []
    for fmt in ("int8", "int4"):
        stored, scales = _quantized(weight, fmt, args.group_size)
        tiles = low_bit_kernel.GEMV_TILES if fmt == "int4" else low_bit_kernel.TILES
        default = dict(tiles)
        for block_n, block_k in itertools.product((16, 32, 64), (128, 256, 512)):
            tiles.update(block_n=block_n, block_k=block_k)
            try:
                fn = lambda s=stored, c=scales, f=fmt: low_bit_linear(x, s, c, f, args.group_size)  # noqa: E731
                records.append(_timed(args, name, out, inp, 1, f"hsv_{fmt}_sweep", fn,
                                      stored.nbytes + scales.nbytes, bandwidth, tiles=dict(tiles)))  # fmt: skip
            finally:
                tiles.update(default)
    return records


def plot(report: dict, path: Path) -> None:
    """Share of the copy bandwidth per method against rows, one panel per layer (the PNG next to the JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in report["records"] if "us" in r and not r["method"].endswith("_sweep")]
    layers_seen = list(dict.fromkeys(r["layer"] for r in records))
    fig, axes = plt.subplots(1, len(layers_seen), figsize=(3.2 * len(layers_seen), 3.2), sharey=True)
    for ax, layer in zip(list(axes) if len(layers_seen) > 1 else [axes], layers_seen):
        for method in dict.fromkeys(r["method"] for r in records):
            points = sorted((r["rows"], r["of_copy_bandwidth"]) for r in records if (r["layer"], r["method"]) == (layer, method))
            ax.plot(*zip(*points), marker="o", label=method)
        first = next(r for r in records if r["layer"] == layer)
        ax.set_title(f"{layer} {first['out']}x{first['inp']}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows")
        ax.axhline(0.75, color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylabel("share of copy bandwidth")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"weight-only low-bit linear, {report['machine'].get('gpu')} ({report['machine'].get('commit')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--sweep", action="store_true", help="also sweep our kernel's launch settings")
    parser.add_argument("--plot", metavar="JSON", help="only redraw the PNG of an earlier result")
    parser.add_argument("--json", default=str(Path(__file__).resolve().parent / "results" / "low_bit_linear.json"))
    args = parser.parse_args()
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_low_bit_linear times CUDA kernels: run it on a GPU")
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    records = []
    todo = [(n, s, r) for n, s in layers(args.shape).items() for r in args.rows]
    for name, (out, inp), rows in tqdm(todo, desc="low-bit linear"):
        records.extend(_layer_records(args, name, out, inp, rows, device, bandwidth))
    if args.sweep:
        for name, (out, inp) in tqdm(layers(args.shape).items(), desc="launch settings"):
            records.extend(_sweep_records(args, name, out, inp, device, bandwidth))
    report = dict(
        benchmark="low_bit_linear",
        machine=machine_info(device),
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
        group_size=args.group_size,
        method="median of 50 replays of a CUDA graph of 20 calls, CUDA events; GBps = (stored weights + scales + "
        "activations + output) / time",
        records=records,
    )
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    plot(report, Path(args.json).with_suffix(".png"))
    for r in records:
        if not r["method"].endswith("_sweep"):
            print(r)
    best = {}
    for r in records:
        if r["method"].endswith("_sweep") and "us" in r:
            key = (r["layer"], r["rows"], r["method"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    for r in best.values():
        print("best", r["layer"], r["rows"], r["method"], r["us"], r["of_copy_bandwidth"], r["tiles"])


if __name__ == "__main__":
    main()
