"""Command-line tool: ``hf-sparse-verify generate ...`` and ``hf-sparse-verify tune ...``.

Without ``--model`` it runs the embedded demo pair (a small trained target and draft, see
``hf_sparse_verify/default_model/README.md``), offline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-sparse-verify", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with speculative decoding")
    gen.add_argument("--model", help="target model folder or Hub id (default: the embedded demo target)")
    gen.add_argument(
        "--draft-model", help="draft model folder or Hub id (default with no --model: the demo draft)"
    )
    gen.add_argument("--strategy", default="auto", help="prompt_lookup, draft_model or auto (default)")
    gen.add_argument("--num-draft-tokens", type=int, default=4, help="K (default 4)")
    gen.add_argument("--k-policy", default="constant", help="constant (default), heuristic or utility")
    group = gen.add_mutually_exclusive_group()
    group.add_argument("--prompt", help="prompt text")
    group.add_argument(
        "--prompt-file", help="a text file (one prompt) or .jsonl with a 'text' field per line (batch)"
    )
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--do-sample", action="store_true")
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--repetition-penalty", type=float)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    gen.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16 (default: float32 on CPU, bf16 on GPU)"
    )
    gen.add_argument("--stats", action="store_true", help="print SpeculationStats")
    gen.add_argument(
        "--compare-plain", action="store_true", help="also run plain generate: speed and equality"
    )
    gen.add_argument("--json", help="write prompts, outputs and stats to this JSON file")
    _add_tune_parser(sub)
    _add_bench_parser(sub)
    return parser


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4, got {text!r}"
        ) from None


def _add_bench_parser(sub) -> None:
    from .bench.shapes import SHAPES

    bench = sub.add_parser("bench", help="benchmarks (needs a GPU for meaningful numbers)")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    step = kinds.add_parser(
        "step",
        help="time one decode/verify forward: our fast path vs transformers eager vs the bandwidth floor",
        description="Builds a random-weight model of a named shape, measures the copy bandwidth, then times one "
        "forward step per (context, new tokens, batch) with our fast path (CUDA graphs + Triton attention) and "
        "with plain transformers eager; writes machine, versions and records with ours_ms, transformers_ms and "
        "floor_ms.",
    )
    step.add_argument("--shape", required=True, choices=sorted(SHAPES), help="model shape preset")
    step.add_argument("--context", type=_int_list, default=(1024,), help="cached tokens, e.g. 1024,65536")
    step.add_argument("--new-tokens", type=_int_list, default=(1, 2, 4, 8, 16), help="e.g. 1,2,4,8,16")
    step.add_argument("--batch", type=_int_list, default=(1,), help="rows, e.g. 1 or 8,32")
    step.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    step.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float16 or float32")
    step.add_argument("--repeats", type=int, default=10, help="timed calls per record (median)")
    step.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    step.add_argument("--no-cuda-graphs", action="store_true", help="time our eager path instead")
    step.add_argument(
        "--vegas-scores", action="store_true", help="also time verify steps that collect Vegas' scores"
    )
    step.add_argument("--json", help="write the result JSON here")


def _add_tune_parser(sub) -> None:
    from .tune import DEFAULT_K_LARGE, DEFAULT_KS, DEFAULT_RATIOS, MIN_GAIN, REFINE_FACTORS

    tune = sub.add_parser(
        "tune",
        help="tune ratio and K of vegas/streaming/quest (the Vegas paper's three steps)",
        description="(1) sweep the ratio at a large K until the mean acceptance length stops rising, (2) sweep K "
        "at that ratio for decode tokens/s, (3) refine the ratio at that K; saves speculation_config.json, "
        "tune_measurements.json and tune_sweep.png into --out.",
    )
    tune.add_argument("--strategy", default="vegas", help="vegas (default), streaming or quest")
    tune.add_argument("--model", help="target model folder or Hub id (default: the embedded demo target)")
    tune.add_argument("--draft-model", help="passed to generate (the ratio-based strategies take none)")
    tune.add_argument(
        "--prompt-file",
        required=True,
        help="a text file (one prompt) or .jsonl with a 'text' field per line; prompts run one by one",
    )
    tune.add_argument("--prompt-len", type=int, help="keep only .jsonl lines whose 'len' equals this")
    tune.add_argument("--max-prompts", type=int, help="use at most this many prompts")
    tune.add_argument("--max-new-tokens", type=int, default=64)
    tune.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    tune.add_argument(
        "--dtype", default=None, help="float32, bfloat16, float16 (default: float32 on CPU, bf16 on GPU)"
    )
    tune.add_argument("--out", default="tuned", help="output folder (default ./tuned)")
    tune.add_argument("--k-large", type=int, default=DEFAULT_K_LARGE, help="K of step 1 (default 8)")
    tune.add_argument("--ratios", type=float, nargs="+", default=list(DEFAULT_RATIOS), help="step 1 ratios")
    tune.add_argument("--ks", type=int, nargs="+", default=list(DEFAULT_KS), help="step 2 K values")
    tune.add_argument(
        "--refine-factors",
        type=float,
        nargs="+",
        default=list(REFINE_FACTORS),
        help="step 3 ratios: the chosen ratio times each",
    )
    tune.add_argument(
        "--min-gain",
        type=float,
        default=MIN_GAIN,
        help="step 1 stops when the acceptance gains less than this (relative)",
    )
    tune.add_argument("--min-tokens", type=int, default=256, help="min_tokens of the budget (default 256)")
    tune.add_argument("--selection", default="two_rows", help="vegas scores: two_rows, all or last_token")
    tune.add_argument("--attention-backend", default="auto")
    tune.add_argument("--no-warmup", action="store_true", help="skip the warm-up call")


# ends mid-line: the demo tokenizer merges a newline with the next line's indentation
DEFAULT_PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"


def _prompts(args) -> list[str]:
    if args.prompt is not None:
        return [args.prompt]
    if args.prompt_file is None:
        return [DEFAULT_PROMPT]
    with open(args.prompt_file, encoding="utf-8") as f:
        if args.prompt_file.endswith(".jsonl"):
            return [json.loads(line)["text"] for line in f if line.strip()]
        return [f.read()]


def cmd_generate(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_sparse_verify as hsv

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    dtype = getattr(torch, dtype_name)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path = f"{hsv.default_model_path()}/target"
        if draft_path is None and args.strategy in ("auto", "draft_model"):
            draft_path = f"{hsv.default_model_path()}/draft"
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
    draft = (
        AutoModelForCausalLM.from_pretrained(draft_path, dtype=dtype).to(device).eval()
        if draft_path
        else None
    )

    prompts = _prompts(args)
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    sampling = {
        k: v
        for k, v in dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).items()
        if v is not None
    }
    if sampling and not args.do_sample:
        raise SystemExit("--temperature/--top-k/--top-p need --do-sample")
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, **sampling)
    if args.repetition_penalty is not None:
        common["repetition_penalty"] = args.repetition_penalty
    config = hsv.SpeculationConfig(
        strategy=args.strategy, num_draft_tokens=args.num_draft_tokens, k_policy=args.k_policy
    )
    out = model.generate(
        **inputs,
        **common,
        custom_generate=hsv.generate,
        speculation=config,
        draft_model=draft,
        return_dict_in_generate=True,
    )
    prompt_len = inputs["input_ids"].shape[1]
    texts = tokenizer.batch_decode(out.sequences[:, prompt_len:], skip_special_tokens=True)
    for prompt, text in zip(prompts, texts):
        if len(prompts) > 1:
            print("=" * 80)
        print(prompt + text)
    stats = out.speculation
    record = {
        "prompts": prompts,
        "outputs": texts,
        "stats": stats.to_dict(),
        "device": device,
        "dtype": dtype_name,
    }
    if args.stats:
        print("-" * 80, file=sys.stderr)
        print(stats.summary(), file=sys.stderr)
    if args.compare_plain:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        plain = model.generate(**inputs, **common)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        plain_s = time.perf_counter() - start
        plain_tps = (plain.shape[1] - prompt_len) * plain.shape[0] / plain_s
        same = plain.shape == out.sequences.shape and bool((plain == out.sequences).all())
        record["plain"] = {"wall_time_s": plain_s, "tokens_per_second": plain_tps, "identical": same}
        print(
            f"plain generate: {plain_tps:.1f} tok/s, speculative: {stats.tokens_per_second:.1f} tok/s, "
            f"identical output: {same}",
            file=sys.stderr,
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return 0


def cmd_tune(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_sparse_verify as hsv

    from .tune import RATIO_STRATEGIES, dense_warning, read_prompts, tune

    if args.strategy not in RATIO_STRATEGIES:
        raise SystemExit(
            f"--strategy {args.strategy!r}: tune sweeps the ratio of {', '.join(RATIO_STRATEGIES)}"
        )
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    model_path = args.model or f"{hsv.default_model_path()}/target"
    base = hsv.SpeculationConfig(
        strategy=args.strategy,
        min_tokens=args.min_tokens,
        selection=args.selection,
        attention_backend=args.attention_backend,
    )
    prompts = read_prompts(args.prompt_file, args.prompt_len, args.max_prompts)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = (
        AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype_name)).to(device).eval()
    )
    draft = (
        AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=getattr(torch, dtype_name))
        .to(device)
        .eval()
        if args.draft_model
        else None
    )
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    print(
        f"{len(prompts)} prompt(s) of {min(lengths)}-{max(lengths)} tokens, {model_path}, {device} {dtype_name}"
    )
    warning = dense_warning(lengths, args.ratios, args.min_tokens)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    config, result = tune(
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
        draft_model=draft,
        warmup=not args.no_warmup,
        out_dir=args.out,
        meta={"model": model_path, "device": device, "dtype": dtype_name},
    )
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
    print(f"saved {args.out}/speculation_config.json, tune_measurements.json, tune_sweep.png")
    return 0


def cmd_bench(args) -> int:
    import torch

    from .bench.step import StepBenchArgs
    from .bench.step import main as bench_step

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
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
        raise SystemExit(f"hf-sparse-verify bench step: {err}") from None
    bench_step(bench_args, args.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "generate":
        return cmd_generate(args)
    if args.command == "tune":
        return cmd_tune(args)
    if args.command == "bench":
        return cmd_bench(args)
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    raise SystemExit(main())
