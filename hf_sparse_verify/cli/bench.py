"""``hf-sparse-verify bench step``: one decode/verify forward of a named model shape with random weights, our fast
path against plain transformers and the bandwidth floor."""

from __future__ import annotations

import sys

from . import _common as common
from ._common import UsageError


def add_parser(sub, parents) -> None:
    bench = sub.add_parser("bench", parents=parents, help="benchmarks (needs a GPU for meaningful numbers)")
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="{step}")
    step = kinds.add_parser(
        "step",
        parents=parents,
        help="time one decode/verify forward: our fast path vs transformers eager vs the bandwidth floor",
        description="Builds a random-weight model of a named shape, measures the copy bandwidth, then times one "
        "forward step per (context, new tokens, batch) with our fast path (CUDA graphs + Triton attention) and "
        "with plain transformers eager; writes machine, versions and records with ours_ms, transformers_ms and "
        "floor_ms.",
    )
    step.add_argument(
        "--shape",
        required=True,
        help="model shape preset: llama-3.1-8b, qwen3-30b-a3b, ... (a wrong name lists them all)",
    )
    step.add_argument(
        "--context",
        type=common.int_list,
        default=(1024,),
        help="cached tokens, e.g. 1024,65536 (default: 1024)",
    )
    step.add_argument(
        "--new-tokens", type=common.int_list, default=(1, 2, 4, 8, 16), help="e.g. 1,2,4,8,16 (the default)"
    )
    step.add_argument("--batch", type=common.int_list, default=(1,), help="rows, e.g. 1 or 8,32 (default: 1)")
    step.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    step.add_argument("--dtype", default="bfloat16", choices=common.DTYPES, help="(default: bfloat16)")
    step.add_argument(
        "--repeats", type=common.positive_int, default=10, help="timed calls per record, median (default: 10)"
    )
    step.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    step.add_argument("--no-cuda-graphs", action="store_true", help="time our eager path instead")
    step.add_argument(
        "--vegas-scores", action="store_true", help="also time verify steps that collect Vegas' scores"
    )
    step.add_argument("--json", help="write the result JSON here")


def run(args) -> int:
    from ..drivers.shapes import SHAPES
    from ..drivers.step_bench import StepBenchArgs
    from ..drivers.step_bench import main as bench_step

    if args.shape not in SHAPES:
        raise UsageError(f"--shape {args.shape!r} is not a preset: use one of {sorted(SHAPES)}")
    common.check_output("--json", args.json)
    device = common.device(args.device)
    try:
        bench_args = StepBenchArgs(
            shape=args.shape,
            contexts=args.context,
            new_tokens=args.new_tokens,
            batches=args.batch,
            device=device,
            dtype=args.dtype,
            repeats=args.repeats,
            transformers=not args.no_transformers,
            cuda_graphs=not args.no_cuda_graphs,
            vegas_scores=args.vegas_scores,
        )
    except ValueError as err:
        raise UsageError(common.one_line(err)) from None
    if not device.startswith("cuda"):
        print(
            "note: no CUDA device, so the copy bandwidth and the bandwidth floors are not measured (n/a), and our "
            "path runs eagerly: step times on a CPU say little about a GPU",
            file=sys.stderr,
        )
    bench_step(bench_args, args.json)
    return 0
