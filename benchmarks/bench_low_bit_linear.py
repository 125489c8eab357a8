"""The weight-only low-bit matmul of draft steps (``hsv::low_bit_linear``) on the linear shapes of a preset model,
against the bytes it reads: per (layer shape, rows, format) the median microseconds of CUDA-graph replays and the
achieved read bandwidth (stored weights + scales + activations) over the measured copy bandwidth, next to the same
layer in bf16 through ``F.linear`` (cuBLAS), PyTorch's own int4 kernel where this torch has it
(``torch.ops.aten._weight_int4pack_mm``, tinygemm, group 128, asymmetric) and GemLite's Triton kernels where
``gemlite`` imports (``gemlite_int4``: 4-bit, groups of ``--group-size``, bf16 scales, zero 8; ``gemlite_int8``: int8
values with one float32 scale per output channel, its ``A16W8_INT8`` layout), the alternatives considered.

GemLite and our kernel round the same weight the same way (our `quantize`); before a method that stores our values
is timed, its output is checked against the dequantized reference (``max_rel_err``: largest absolute difference over
the largest reference magnitude); above `MAX_REL_ERR` it records an error instead of a time.

``--cold``: each method gets `cold_copies` copies of what it reads (weights, scales, zeros), together over
`COLD_BYTES` (more than any GPU's L2), and the captured graph cycles through them (call ``i`` reads copy
``i % copies``), so no call finds its weight in L2; by default (warm, as the first records) every call reads one copy,
which a small format keeps in L2. ``--methods`` times only the methods named.

``--sweep`` also times our kernel at one row over a grid of launch settings (output block x input block of the
settings each format's one-row launch takes: `kernel.GEMV_TILES` for int4, `kernel.TILES` for int8) and records each
as method ``hsv_{fmt}_sweep`` with its ``tiles``.

Writes ``--json`` (default ``benchmarks/results/low_bit_linear.json``, ``low_bit_linear_cold.json`` with ``--cold``):
``records``, one per (shape, layer, rows, method), with ``us``, ``bytes``, ``GBps``, ``of_copy_bandwidth``, ``cold``,
``copies`` (and ``max_rel_err`` where checked; GemLite's ``matmul_type`` and Triton ``config``); a method that fails
records its error.

    python benchmarks/bench_low_bit_linear.py --shape llama-3.1-8b --rows 1 2 4 8 16 64
    python benchmarks/bench_low_bit_linear.py --rows 1 2 4 8 --cold --methods hsv_int4 gemlite_int4 bf16_cublas
    python benchmarks/bench_low_bit_linear.py --plot benchmarks/results/low_bit_linear.json   # redraw the PNG
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks._timing import graph_us  # noqa: E402
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info  # noqa: E402
from hf_sparse_verify.drivers.shapes import shape_config  # noqa: E402
from hf_sparse_verify.kernels.low_bit import dequantize, low_bit_linear, pack, quantize  # noqa: E402
from hf_sparse_verify.kernels.low_bit import kernel as low_bit_kernel  # noqa: E402

#: every method, in the order they run; ``--methods`` picks among them
METHODS = ("bf16_cublas", "hsv_int8", "hsv_int4", "torch_int4_tinygemm", "gemlite_int8", "gemlite_int4")
#: ``--cold``: a method's copies together exceed this many bytes (H100 / H200 L2: 50 / 60 MB)
COLD_BYTES = 256 * 2**20
#: a checked method whose output is further than this from the reference (relative to its largest magnitude)
#: records an error, not a time
MAX_REL_ERR = 2e-2


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


@dataclass
class Method:
    """One way to compute a layer on the benchmark's input: ``call(*operands)``, the operands it reads (tensors, which
    a cold run clones once per copy), the bytes of them one call reads, for methods that store our `quantize` values
    the fp32 output they must match (``expected``), and fields for its records. ``describe`` (optional) adds fields
    once the method has run (GemLite's chosen kernel and launch settings)."""

    call: Callable[..., torch.Tensor]
    operands: tuple
    weight_bytes: int
    expected: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    describe: Callable[[], dict] | None = None


def cold_copies(copy_bytes: int, cold: bool) -> int:
    """Copies of a method's operands to cycle through: 1 when warm; cold, the fewest (2 or more) whose bytes together
    exceed `COLD_BYTES`."""
    if not cold:
        return 1
    return max(2, COLD_BYTES // max(copy_bytes, 1) + 1)


def replicate(operands: tuple, copies: int) -> list[tuple]:
    """``copies`` sets of ``operands``: the given one, then clones (tensors cloned with their strides, anything else
    shared). Clones are cheap next to quantizing or packing again."""
    clone = lambda o: o.clone() if isinstance(o, torch.Tensor) else o  # noqa: E731
    return [operands] + [tuple(clone(o) for o in operands) for _ in range(copies - 1)]


def expected_output(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x`` times the weight our `quantize` ``values`` / ``scales`` stand for, in float32: what every method that
    stores those values must compute."""
    return F.linear(x.float(), dequantize(values, scales, fmt))


def max_rel_err(y: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference of ``y`` from ``expected`` over the largest magnitude of ``expected``."""
    return float((y.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-30))


def _tinygemm(weight: torch.Tensor, x: torch.Tensor, group: int = 128) -> Method:
    """PyTorch's int4 weight-only kernel (the layout torchao's tinygemm config uses): asymmetric int4 per group,
    bf16 scales and zeros (converted once here, not per call)."""
    out, inp = weight.shape
    w = weight.float().view(out, inp // group, group)
    lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp_min(1e-6)
    q = ((w - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out, inp)
    zero = lo + 8 * scale  # tinygemm dequantizes (q - 8) * scale + zero
    scales_zeros = torch.stack([scale.squeeze(-1), zero.squeeze(-1)], dim=-1).transpose(0, 1).contiguous()
    packed_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    packed = torch.ops.aten._convert_weight_to_int4pack(packed_u8, 8)
    scales_zeros = scales_zeros.to(torch.bfloat16)
    return Method(
        lambda p, sz: torch.ops.aten._weight_int4pack_mm(x, p, group, sz), (packed, scales_zeros),
        out * inp // 2 + 4 * out * (inp // group),
    )  # fmt: skip


# GemLite (`pip install gemlite`): its formats, built from our `quantize` output, and its layers.


def gemlite_int4_inputs(values: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16):
    """What ``GemLiteLinear.pack`` takes for our int4 ``values`` / ``scales``: ``W_q`` uint8 ``[out, in]`` (value + 8,
    0 .. 15), ``scales`` ``[out, groups]`` in ``dtype`` and the integer zero 8, so that gemlite's
    ``(W_q - zeros) * scales`` is our dequantized weight (exactly, with the scales rounded to ``dtype``)."""
    return (values.to(torch.int16) + 8).to(torch.uint8), scales.to(dtype), 8


def gemlite_int8_inputs(values: torch.Tensor, scales: torch.Tensor):
    """What gemlite's ``A16W8_INT8.from_weights`` takes for our int8 ``values`` / ``scales``: the int8 values as they
    are (symmetric, no zero; [-127, 127] fits its [-128, 127]) and one float32 scale per output channel
    ``[out, 1]`` (its default ``fp32_scale``), which it applies to the weight before the dot product (its
    ``W_group_mode`` 2, ``channel_scale_mode`` 0): exactly our dequantized weight."""
    return values.contiguous(), scales.float().reshape(-1, 1)


def gemlite_dequantize(W_q: torch.Tensor, scales: torch.Tensor, zeros, group_size: int) -> torch.Tensor:
    """Gemlite's formula ``(W_q - zeros) * scales`` (HQQ's) in float32 for ``W_q`` ``[out, in]`` and ``scales`` /
    ``zeros`` per (output channel, group of ``group_size`` inputs); ``zeros`` an integer, a tensor or None."""
    out, inp = W_q.shape
    w = W_q.float().view(out, inp // group_size, group_size)
    if zeros is not None:
        w = w - (zeros.float().view(out, -1, 1) if isinstance(zeros, torch.Tensor) else float(zeros))
    return (w * scales.float().view(out, -1, 1)).view(out, inp)


def import_gemlite(autotune: str = "fast"):
    """The ``gemlite`` module, with its autotuning set: ``"fast"`` is its default (the launch settings it ships for
    this GPU where its configs name it, else a short autotune per shape and row count); ``"max"`` drops the shipped
    settings and tunes each shape over its full grid (slow)."""
    gemlite = importlib.import_module("gemlite")
    importlib.import_module("gemlite.helper")
    if autotune == "max":
        gemlite.reset_config()
        gemlite.set_autotune("max")
    return gemlite


def gemlite_layer(gemlite, fmt: str, values: torch.Tensor, scales: torch.Tensor, group_size: int,
                  dtype=torch.bfloat16):  # fmt: skip
    """A ``GemLiteLinear`` for our `quantize` output (``values`` / ``scales`` of ``fmt``), activations and output in
    ``dtype``: int4 packed by ``GemLiteLinear.pack`` (4 bits, ``group_size``, `gemlite_int4_inputs`), int8 through its
    ``A16W8_INT8`` helper (`gemlite_int8_inputs`)."""
    out, inp = values.shape
    gl_dtype = {torch.bfloat16: gemlite.DType.BF16, torch.float16: gemlite.DType.FP16}[dtype]
    if fmt == "int4":
        W_q, gl_scales, zeros = gemlite_int4_inputs(values, scales, dtype)
        layer = gemlite.GemLiteLinear(
            4,
            group_size=group_size,
            in_features=inp,
            out_features=out,
            input_dtype=gl_dtype,
            output_dtype=gl_dtype,
        )
        layer.pack(W_q, gl_scales, zeros, None)
        return layer
    W_q, gl_scales = gemlite_int8_inputs(values, scales)
    return gemlite.helper.A16W8_INT8(device=values.device, dtype=dtype).from_weights(W_q, scales=gl_scales)


def gemlite_read_bytes(layer) -> int:
    """Bytes of the tensors a GemLite layer reads per call: packed weights, scales, zeros (a scalar or empty
    placeholder where it has none per group)."""
    return sum(t.nbytes for t in layer.get_tensor_args()[:3])


def _gemlite_method(gemlite, fmt: str, x: torch.Tensor, values, scales, group_size: int, expected) -> Method:
    """A GemLite layer as a `Method`: its forward (``gemlite.forward_functional``, what ``layer(x)`` runs) on the
    layer's tensors, which cold copies clone."""
    layer = gemlite_layer(gemlite, fmt, values, scales, group_size, x.dtype)
    meta = layer.get_meta_args()
    nbits = 4 if fmt == "int4" else 8
    matmul_type = gemlite.core.get_matmul_type(x.shape[0], nbits)

    def describe() -> dict:
        try:  # the Triton autotuner that ran last for this kernel type (after a reload by set_autotune too)
            kernel_type = gemlite.core.GEMLITE_TRITON_MAPPING[matmul_type]
            kernel_type = getattr(importlib.import_module(kernel_type.__module__), kernel_type.__name__)
            return dict(config=str(kernel_type.kernel[0].best_config)[:300])
        except Exception:
            return {}

    return Method(
        lambda *tensors: gemlite.forward_functional(x, None, list(tensors), meta), tuple(layer.get_tensor_args()),
        gemlite_read_bytes(layer), expected,
        dict(matmul_type=matmul_type, W_group_mode=meta[10], channel_scale_mode=meta[9]),
        describe,
    )  # fmt: skip


def _measure(args, base: dict, method: Method, copies: list[tuple], bandwidth: float) -> dict:
    """One record: ``method`` checked against its expected output (where it has one) on the first copy, which also
    warms it up (GemLite autotunes on its first call of a shape), then timed (`graph_us`) cycling through
    ``copies``, against the bytes one call moves (weights + activations + output); or the error it raised."""
    rec = dict(base, **method.extra)
    try:
        y = method.call(*copies[0])
        torch.cuda.synchronize()
        if method.describe is not None:
            rec.update(method.describe())
        if method.expected is not None:
            err = max_rel_err(y, method.expected)
            rec["max_rel_err"] = float(f"{err:.3g}") if err < float("inf") else str(err)  # JSON has no nan
            if not err <= MAX_REL_ERR:
                return dict(rec, error=f"output off the reference: max_rel_err {err:.3g} > {MAX_REL_ERR}")
        del y
        us = graph_us(method.call, copies=copies)
    except Exception as err:
        return dict(rec, error=f"{type(err).__name__}: {err}"[:300])
    moved = method.weight_bytes + base["rows"] * base["inp"] * 2 + base["rows"] * base["out"] * 2
    gbps = moved / us / 1e3
    return dict(
        rec,
        us=round(us, 2),
        bytes=moved,
        GBps=round(gbps, 1),
        of_copy_bandwidth=round(gbps / (bandwidth / 1e9), 3),
    )


def _method_records(args, base: dict, build: Callable[[], Method], bandwidth: float) -> list[dict]:
    """Builds a method, makes its copies (`cold_copies`), measures it, and frees the copies."""
    try:
        method = build()
    except Exception as err:  # not in this torch build / gemlite missing / another signature
        return [dict(base, copies=0, error=f"{type(err).__name__}: {err}"[:300])]
    copies = replicate(method.operands, cold_copies(method.weight_bytes, args.cold))
    base = dict(base, copies=len(copies))
    try:
        return [_measure(args, base, method, copies, bandwidth)]
    finally:
        del copies, method
        torch.cuda.empty_cache()


def _quantized(weight: torch.Tensor, fmt: str, group: int):
    values, scales = quantize(weight, fmt, group)
    return pack(values, fmt), scales


def _hsv(x: torch.Tensor, stored, scales, fmt: str, group_size: int, expected, **extra) -> Method:
    """Our kernel (``hsv::low_bit_linear``) on stored weights and float32 scales."""
    return Method(
        lambda s, c: low_bit_linear(x, s, c, fmt, group_size), (stored, scales), stored.nbytes + scales.nbytes,
        expected, extra,
    )  # fmt: skip


def _layer_records(
    args, name: str, out: int, inp: int, rows: int, device, bandwidth: float, gemlite
) -> list[dict]:
    """Every method of ``args.methods`` on one layer shape and row count. ``gemlite``: the module, or the error
    importing it raised."""
    weight = torch.randn(out, inp, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(rows, inp, device=device, dtype=torch.bfloat16)
    quantized = {}  # fmt -> (values, scales, expected output): every method of a format rounds the weight alike

    def q(fmt: str):
        if fmt not in quantized:
            values, scales = quantize(weight, fmt, args.group_size)
            quantized[fmt] = values, scales, expected_output(x, values, scales, fmt)
        return quantized[fmt]

    def gemlite_build(fmt: str) -> Callable[[], Method]:
        def build() -> Method:
            if isinstance(gemlite, Exception):
                raise gemlite
            return _gemlite_method(gemlite, fmt, x, *q(fmt)[:2], args.group_size, q(fmt)[2])

        return build

    builds = {
        "bf16_cublas": lambda: Method(lambda w: F.linear(x, w), (weight,), weight.nbytes),
        "hsv_int8": lambda: _hsv(
            x, pack(q("int8")[0], "int8"), q("int8")[1], "int8", args.group_size, q("int8")[2]
        ),
        "hsv_int4": lambda: _hsv(
            x, pack(q("int4")[0], "int4"), q("int4")[1], "int4", args.group_size, q("int4")[2]
        ),
        "torch_int4_tinygemm": lambda: _tinygemm(weight, x),
        "gemlite_int8": gemlite_build("int8"),
        "gemlite_int4": gemlite_build("int4"),
    }
    base = dict(shape=args.shape, layer=name, out=out, inp=inp, rows=rows, cold=args.cold)
    records = []
    for method in args.methods:
        records.extend(_method_records(args, dict(base, method=method), builds[method], bandwidth))
    return records


def _sweep_records(args, name: str, out: int, inp: int, device, bandwidth: float) -> list[dict]:
    """Our kernel at one row over a grid of launch settings (output block x input block), for each format the
    settings its one-row launch takes (int4: `low_bit_kernel.GEMV_TILES`, int8: `low_bit_kernel.TILES`)."""
    weight = torch.randn(out, inp, device=device, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, inp, device=device, dtype=torch.bfloat16)
    records = []
    for fmt in ("int8", "int4"):
        values, scales = quantize(weight, fmt, args.group_size)
        method = _hsv(
            x, pack(values, fmt), scales, fmt, args.group_size, expected_output(x, values, scales, fmt)
        )
        copies = replicate(method.operands, cold_copies(method.weight_bytes, args.cold))
        base = dict(shape=args.shape, layer=name, out=out, inp=inp, rows=1, method=f"hsv_{fmt}_sweep",
                    cold=args.cold, copies=len(copies))  # fmt: skip
        tiles = low_bit_kernel.GEMV_TILES if fmt == "int4" else low_bit_kernel.TILES
        default = dict(tiles)
        for block_n, block_k in itertools.product((16, 32, 64), (128, 256, 512)):
            tiles.update(block_n=block_n, block_k=block_k)
            try:
                records.append(_measure(args, dict(base, tiles=dict(tiles)), method, copies, bandwidth))
            finally:
                tiles.update(default)
        del copies, method
        torch.cuda.empty_cache()
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
            points = sorted(
                (r["rows"], r["of_copy_bandwidth"])
                for r in records
                if (r["layer"], r["method"]) == (layer, method)
            )
            ax.plot(*zip(*points), marker="o", label=method)
        first = next(r for r in records if r["layer"] == layer)
        ax.set_title(f"{layer} {first['out']}x{first['inp']}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows")
        ax.axhline(0.75, color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylabel("share of copy bandwidth")
    axes[0].legend(fontsize=7)
    cold = ", cold (weights not in L2)" if report.get("cold") else ""
    machine = report["machine"]
    fig.suptitle(
        f"weight-only low-bit linear{cold}, {machine.get('gpu')} ({machine.get('commit')})", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64])
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                        help=f"time only these (default: all of {' '.join(METHODS)})")  # fmt: skip
    parser.add_argument("--cold", action="store_true",
                        help=f"cycle through copies of each method's weights, together over {COLD_BYTES >> 20} MiB, "
                        "so that no call finds them in L2 (default: one copy, warm)")  # fmt: skip
    parser.add_argument("--gemlite-autotune", choices=("fast", "max"), default="fast",
                        help="GemLite's autotuning: its default (fast, with the settings it ships for this GPU) or "
                        "max (its full grid per shape, slow)")  # fmt: skip
    parser.add_argument("--sweep", action="store_true", help="also sweep our kernel's launch settings")
    parser.add_argument("--plot", metavar="JSON", help="only redraw the PNG of an earlier result")
    parser.add_argument("--json", help="the report (default: benchmarks/results/low_bit_linear.json, "
                        "low_bit_linear_cold.json with --cold)")  # fmt: skip
    args = parser.parse_args()
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_low_bit_linear times CUDA kernels: run it on a GPU")
    results = Path(__file__).resolve().parent / "results"
    args.json = args.json or str(
        results / ("low_bit_linear_cold.json" if args.cold else "low_bit_linear.json")
    )
    args.methods = [m for m in METHODS if m in args.methods]
    device = torch.device("cuda")
    gemlite, gemlite_info = None, None
    if any(m.startswith("gemlite_") for m in args.methods):
        try:
            gemlite = import_gemlite(args.gemlite_autotune)
            shipped = getattr(gemlite.core, "selected_tag", None) if args.gemlite_autotune == "fast" else None
            gemlite_info = dict(
                version=gemlite.__version__, autotune=args.gemlite_autotune,
                shipped_config=Path(shipped).name if shipped else None,
            )  # fmt: skip
        except Exception as err:  # recorded per layer by each gemlite method
            gemlite = err
            gemlite_info = dict(error=f"{type(err).__name__}: {err}"[:300])
    bandwidth = copy_bandwidth(device)
    records = []
    todo = [(n, s, r) for n, s in layers(args.shape).items() for r in args.rows]
    for name, (out, inp), rows in tqdm(todo, desc="low-bit linear"):
        records.extend(_layer_records(args, name, out, inp, rows, device, bandwidth, gemlite))
    if args.sweep:
        for name, (out, inp) in tqdm(layers(args.shape).items(), desc="launch settings"):
            records.extend(_sweep_records(args, name, out, inp, device, bandwidth))
    calls = "a CUDA graph of 20 calls"
    if args.cold:
        calls = (
            "a CUDA graph of 20 calls rounded up to a multiple of the copies, call i reading copy i % copies "
            f"(copies of the method's weights, scales and zeros together over {COLD_BYTES >> 20} MiB)"
        )
    report = dict(
        benchmark="low_bit_linear",
        machine=machine_info(device),
        copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
        group_size=args.group_size,
        cold=args.cold,
        cold_bytes=COLD_BYTES if args.cold else None,
        methods=args.methods,
        gemlite=gemlite_info,
        max_rel_err=MAX_REL_ERR,
        method=f"median of 50 replays of {calls}, CUDA events; GBps = (stored weights + scales + activations + "
        "output) / time",
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
