"""``hf-sparse-verify tune``: the Vegas paper's three-step search of ratio and K for the strategies with a
KV-selection ratio (`Drafter.tunes_ratio`)."""

from __future__ import annotations

import json
import sys

from ..config import ATTENTION_BACKENDS, SELECTIONS
from ..drivers.tune import (
    DEFAULT_K_LARGE,
    DEFAULT_KS,
    DEFAULT_RATIOS,
    MIN_GAIN,
    REFINE_FACTORS,
    can_plot,
    dense_warning,
    ratio_strategies,
)
from ..drivers.tune import tune as tune_model
from ..registry import DRAFTERS
from . import _common as common
from ._common import UsageError


def add_parser(sub, parents) -> None:
    tune = sub.add_parser(
        "tune",
        parents=parents,
        help="tune ratio and K of vegas/streaming/quest (the Vegas paper's three steps)",
        description="(1) sweep the ratio at a large K until the mean acceptance length stops rising, (2) sweep K "
        "at that ratio for decode tokens/s, (3) refine the ratio at that K; saves speculation_config.json, "
        "tune_measurements.json and tune_sweep.png into --out.",
    )
    tune.add_argument(
        "--strategy",
        default="vegas",
        choices=list(DRAFTERS),
        help="a strategy with a KV-selection ratio: vegas, streaming or quest (default: vegas)",
    )
    tune.add_argument("--model", help="target model folder or Hub id (default: the embedded demo target)")
    tune.add_argument(
        "--draft-model",
        metavar="DIR_OR_ID",
        help="refused: vegas, streaming and quest draft with the target itself (kept for later strategies)",
    )
    tune.add_argument(
        "--prompt-file",
        required=True,
        metavar="FILE",
        help='a text file (one prompt) or .jsonl with {"text": "..."} per line; prompts run one by one',
    )
    tune.add_argument(
        "--prompt-len", type=common.positive_int, help="keep only .jsonl lines whose 'len' equals this"
    )
    tune.add_argument(
        "--max-prompts", type=common.positive_int, help="use at most this many prompts (default: all)"
    )
    tune.add_argument("--max-new-tokens", type=common.positive_int, default=64, help="(default: 64)")
    tune.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    tune.add_argument("--dtype", choices=common.DTYPES, help="(default: float32 on CPU, bfloat16 on GPU)")
    tune.add_argument("--out", default="tuned", help="output folder (default: ./tuned)")
    tune.add_argument(
        "--k-large",
        type=common.positive_int,
        default=DEFAULT_K_LARGE,
        help=f"K of step 1 (default: {DEFAULT_K_LARGE})",
    )
    tune.add_argument(
        "--ratios",
        type=common.probability,
        nargs="+",
        default=list(DEFAULT_RATIOS),
        help=f"step 1 ratios (default: {' '.join(map(str, DEFAULT_RATIOS))})",
    )
    tune.add_argument(
        "--ks",
        type=common.positive_int,
        nargs="+",
        default=list(DEFAULT_KS),
        help=f"step 2 K values (default: {' '.join(map(str, DEFAULT_KS))})",
    )
    tune.add_argument(
        "--refine-factors",
        type=common.positive_float,
        nargs="+",
        default=list(REFINE_FACTORS),
        help=f"step 3 ratios: the chosen ratio times each (default: {' '.join(map(str, REFINE_FACTORS))})",
    )
    tune.add_argument(
        "--min-gain",
        type=float,
        default=MIN_GAIN,
        help=f"step 1 stops when the acceptance gains less than this, relative (default: {MIN_GAIN})",
    )
    tune.add_argument(
        "--min-tokens", type=common.positive_int, default=256, help="min_tokens of the budget (default: 256)"
    )
    tune.add_argument(
        "--selection", default="two_rows", choices=SELECTIONS, help="vegas scores (default: two_rows)"
    )
    tune.add_argument(
        "--attention-backend", default="auto", choices=ATTENTION_BACKENDS, help="(default: auto)"
    )
    tune.add_argument("--no-warmup", action="store_true", help="skip the warm-up call")


def run(args) -> int:
    if args.strategy not in ratio_strategies():
        raise UsageError(
            f"--strategy {args.strategy} has no KV-selection ratio to tune: use one of {ratio_strategies()}"
        )
    prompts = common.tuning_prompts(args)
    common.check_model("--model", args.model)
    if args.draft_model is not None:
        raise UsageError(f"--draft-model: {args.strategy} drafts with the target itself; drop --draft-model")
    base = common.config(
        strategy=args.strategy,
        min_tokens=args.min_tokens,
        selection=args.selection,
        attention_backend=args.attention_backend,
    )
    device = common.device(args.device)

    dtype_name = common.default_dtype(args.dtype, device)
    model_path = args.model or common.demo_model("target")
    tokenizer, model = common.load_model("--model", model_path, dtype_name, device)
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    print(
        f"{len(prompts)} prompt(s) of {min(lengths)}-{max(lengths)} tokens, {model_path}, {device} {dtype_name}"
    )
    warning = dense_warning(lengths, args.ratios, args.min_tokens)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        config, result = tune_model(
            model,
            tokenizer,
            prompts,
            args.strategy,
            max_new_tokens=args.max_new_tokens,
            ratios=args.ratios,
            ks=args.ks,
            k_large=args.k_large,
            refine_factors=args.refine_factors,
            min_gain=args.min_gain,
            base_config=base,
            warmup=not args.no_warmup,
            out_dir=args.out,
            meta={"model": model_path, "device": device, "dtype": dtype_name},
        )
    except (
        ValueError,
        NotImplementedError,
    ) as err:  # the library's checks: unsupported model, prompt too long
        raise UsageError(common.one_line(err)) from err
    for name, points in result.steps.items():
        print(name)
        for m in points:
            print(
                f"  ratio={m.ratio:<8g} K={m.k:<3d} mean acceptance length={m.mean_acceptance_length:6.3f} "
                f"decode tokens/s={m.tokens_per_second:8.1f}"
            )
    best = result.best
    print(
        f"best: ratio={config.ratio:g} K={config.num_draft_tokens} ({best.tokens_per_second:.1f} decode tokens/s, "
        f"mean acceptance length {best.mean_acceptance_length:.3f}); step 1 stopped at ratio={result.ratio_step1:g}"
    )
    print(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    plotted = can_plot()
    print(
        f"saved {args.out}/speculation_config.json, tune_measurements.json"
        + (", tune_sweep.png" if plotted else "")
    )
    if not plotted:
        print("no tune_sweep.png: matplotlib is not installed (pip install 'hf-sparse-verify[bench]')")
    return 0
