"""Side by side in one process: our captured step with and without the fused module replacements of round 2
(`FusedQKVAttention`: q/k/v in one launch, norm + rotary in another, ``o_proj`` in a third; `FusedRouter`: the MoE
router in one launch; `FusedDecoderLayer`: residual adds fused)
and with and without programmatic dependent launch of our kernels (``no_pdl``), on random-weight shapes, against
the bandwidth floor of ``hf-sparse-verify bench step``.

Each variant is timed twice, interleaved (A B A B), and each record keeps both medians and their mean, so drift
between the runs shows.

``python benchmarks/bench_fused_modules.py --shapes llama-3.1-8b qwen3-30b-a3b --context 1024 --new-tokens 1 8 16
--json out.json``
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.drivers.shapes import kv_bytes, random_model, weight_bytes_per_step
from hf_sparse_verify.drivers.step_bench import StepBenchArgs, _free, _ours
from hf_sparse_verify.integrations import qkv_attention as attention_module
from hf_sparse_verify.kernels._triton import set_pdl
from hf_sparse_verify.kernels.qkv_rope import kernel as qkv_kernel

#: variant name -> StepBenchArgs fields, ``pdl``: whether our kernels launch with programmatic dependent launch, and
#: optionally ``qkv_tiles``: `qkv_rope.kernel.TILES` entries set for that variant only. ``fused_attention_router`` is
#: the library's default (every fused module, PDL on); since the twelfth session that includes `FusedDecoderLayer`,
#: which ``no_fused_layers`` leaves out.
VARIANTS = {
    "before": dict(fused_attention=False, fused_router=False, fused_layers=False, pdl=True),
    "fused_attention": dict(fused_attention=True, fused_router=False, fused_layers=False, pdl=True),
    "fused_attention_router": dict(fused_attention=True, fused_router=True, pdl=True),
    "no_pdl": dict(fused_attention=True, fused_router=True, pdl=False),
    "no_fused_layers": dict(fused_attention=True, fused_router=True, fused_layers=False, pdl=True),
    "old_qkv_tiles": dict(
        fused_attention=True, fused_router=True, pdl=True, qkv_tiles=dict(num_warps=4, num_stages=3)
    ),
    "cublas_o_proj": dict(fused_attention=True, fused_router=True, pdl=True, triton_o_proj=False),
    "separate_cache_write": dict(fused_attention=True, fused_router=True, pdl=True, direct_cache_write=False),
}


#: variant keys -> the `hf_sparse_verify.integrations.qkv_attention` switch they set
ATTENTION_FLAGS = {"triton_o_proj": "TRITON_O_PROJ", "direct_cache_write": "DIRECT_CACHE_WRITE"}


@contextlib.contextmanager
def _settings(tiles: dict, flags: dict):
    """Within the block, `qkv_rope.kernel.TILES` updated with ``tiles`` and the attention module's switches set as
    ``flags`` says; both restored on exit."""
    saved_tiles = dict(qkv_kernel.TILES)
    saved_flags = {name: getattr(attention_module, name) for name in flags}
    qkv_kernel.TILES.update(tiles)
    for name, value in flags.items():
        setattr(attention_module, name, value)
    try:
        yield
    finally:
        qkv_kernel.TILES.update(saved_tiles)
        for name, value in saved_flags.items():
            setattr(attention_module, name, value)


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["llama-3.1-8b", "qwen3-30b-a3b"])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=20)
    _records.add_arguments(parser, "fused_modules")
    parser.add_argument(
        "--out-tiles", type=int, nargs=4, metavar=("N", "K", "WARPS", "STAGES"),
        help="row_linear (o_proj) tiles for every variant, e.g. the best of sweep_qkv_rope.py --kernel out",
    )  # fmt: skip
    args = parser.parse_args()
    args.out_tiles = (
        dict(zip(("out_n", "out_k", "out_warps", "out_stages"), args.out_tiles)) if args.out_tiles else {}
    )
    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = copy_bandwidth(device)
    widths = sorted(args.new_tokens)
    records = []
    total = len(args.shapes) * len(args.variants) * 2 * len(widths)
    with tqdm(total=total, desc="fused modules", file=sys.stderr) as bar:
        for shape in args.shapes:
            model = random_model(shape, device, dtype)
            base = StepBenchArgs(
                shape=shape, contexts=(args.context,), new_tokens=tuple(widths), repeats=args.repeats
            )
            runs: dict[str, list[dict]] = {v: [] for v in args.variants}
            pdl_default = set_pdl(True)
            for _ in range(2):
                for variant in args.variants:
                    fields = dict(VARIANTS[variant])
                    set_pdl(fields.pop("pdl"))
                    tiles = {**fields.pop("qkv_tiles", {}), **args.out_tiles}
                    flags = {name: fields.pop(key) for key, name in ATTENTION_FLAGS.items() if key in fields}
                    step_args = dataclasses.replace(base, **fields)
                    with _settings(tiles, flags):
                        times, _, mode = _ours(model, args.context, 1, widths, step_args, device, bar)
                    runs[variant].append(times)
                    _free(device)
            set_pdl(pdl_default)
            for width in widths:
                floor = 1000 * (
                    weight_bytes_per_step(model, width, 1) + kv_bytes(model, args.context, 1, dtype)
                )
                floor /= bandwidth
                for variant in args.variants:
                    pair = [r[width] for r in runs[variant]]
                    ms = sum(pair) / 2
                    records.append(dict(
                        shape=shape, context=args.context, batch=1, new_tokens=width, variant=variant, mode=mode,
                        ms=round(ms, 4), runs_ms=[round(p, 4) for p in pair], floor_ms=round(floor, 4),
                        over_floor=round(ms / floor, 3),
                    ))  # fmt: skip
            del model
            _free(device)
    for r in records:
        print(f"{r['shape']:>14} ctx {r['context']} new {r['new_tokens']:>2} {r['variant']:>16}: {r['ms']:7.3f} ms "
              f"{r['runs_ms']}  floor {r['floor_ms']:.3f}  x{r['over_floor']:.2f}")  # fmt: skip
    if args.json:
        _records.save(args, dict(machine=machine_info(device), copy_bandwidth_GBps=round(bandwidth / 1e9, 1),
                           method=__doc__.split("\n\n")[1].replace("\n", " "), records=records,
                           tiles=dict(qkv_kernel.TILES, **args.out_tiles)), device, setting=" ".join(args.variants))  # fmt: skip


if __name__ == "__main__":
    main()
