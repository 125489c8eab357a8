"""``hf-sparse-verify generate``: speculative generation from the command line (the embedded demo pair, offline,
without ``--model``)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ..config import SpeculationConfig
from ..registry import DRAFTERS, K_POLICIES, resolve, summary
from . import _common as common
from ._common import UsageError

# ends mid-line: the demo tokenizer merges a newline with the next line's indentation
DEFAULT_PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"
AUTO_HELP = (
    "the planner: per step, the measured fastest of prompt_lookup, draft_model (when a draft model is given; the "
    "demo pair has one), vegas (long prompts on a GPU) and plain decoding, and its K"
)


def add_parser(sub, parents) -> None:
    strategies = {"auto": AUTO_HELP, **{name: summary(DRAFTERS, name) for name in DRAFTERS}}
    policies = {name: summary(K_POLICIES, name) for name in K_POLICIES}
    gen = sub.add_parser(
        "generate",
        parents=parents,
        help="generate text with speculative decoding",
        description="Generate text with speculative decoding. Without --model it runs the embedded demo pair\n"
        "(a 2.4M-parameter target and a 0.8M draft trained on Python code), offline. Greedy output equals\n"
        "plain model.generate token for token.",
        epilog=common.table("strategies (--strategy)", strategies)
        + "\n"
        + common.table("K policies (--k-policy)", policies)
        + "\nexamples:\n"
        "  hf-sparse-verify generate --stats --compare-plain\n"
        "  hf-sparse-verify generate --strategy prompt_lookup --prompt-file prompts.jsonl\n"
        "  hf-sparse-verify generate --model Qwen/Qwen3-8B --draft-model Qwen/Qwen3-0.6B --prompt 'def fib(n):'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument(
        "--model",
        metavar="DIR_OR_ID",
        help="target model: a folder or Hub id (default: the embedded demo target)",
    )
    gen.add_argument(
        "--draft-model",
        metavar="DIR_OR_ID",
        help="draft model for --strategy draft_model/auto: a folder or Hub id (default: the demo draft when "
        "--model is not given, else none)",
    )
    gen.add_argument(
        "--strategy",
        default="auto",
        choices=["auto", *DRAFTERS],
        help="how to draft (default: auto; see 'strategies' below)",
    )
    gen.add_argument(
        "--draft-weights",
        choices=["int4", "int8", "auto"],
        help="draft with the target's low-bit copy: the weights of --strategy low_bit (default int4), or of the "
        "draft steps of vegas / streaming / quest (default: the model's own); auto: int4 or int8, whichever is "
        "measured faster than bf16 at the call's rows, else the model's own",
    )
    gen.add_argument(
        "--num-draft-tokens",
        type=common.whole,
        default=4,
        metavar="K",
        help="draft tokens per step; the starting K of the adaptive policies (default: 4)",
    )
    gen.add_argument(
        "--k-policy",
        default="constant",
        choices=list(K_POLICIES),
        help="how K changes from step to step (default: constant; see 'K policies' below)",
    )
    prompts = gen.add_mutually_exclusive_group()
    prompts.add_argument(
        "--prompt", metavar="TEXT", help="the prompt text (default: a short Python snippet for the demo pair)"
    )
    prompts.add_argument(
        "--prompt-file",
        metavar="FILE",
        help='a text file (the whole file is one prompt) or a .jsonl file with {"text": "..."} on each line '
        "(a batch)",
    )
    gen.add_argument(
        "--max-new-tokens",
        type=common.positive_int,
        default=64,
        metavar="N",
        help="tokens to generate (default: 64)",
    )
    gen.add_argument(
        "--do-sample",
        action="store_true",
        help="sample instead of greedy decoding (default: greedy, which matches plain generate token for token)",
    )
    gen.add_argument(
        "--temperature",
        type=common.positive_float,
        metavar="T",
        help="sampling temperature (needs --do-sample; default: the model's)",
    )
    gen.add_argument(
        "--top-k",
        type=common.positive_int,
        metavar="K",
        help="sample from the k most likely tokens (needs --do-sample)",
    )
    gen.add_argument(
        "--top-p",
        type=common.probability,
        metavar="P",
        help="nucleus sampling mass in (0, 1] (needs --do-sample)",
    )
    gen.add_argument(
        "--repetition-penalty",
        type=common.positive_float,
        metavar="R",
        help="penalty > 1 discourages repeats (default: none)",
    )
    gen.add_argument(
        "--seed", type=common.whole, default=0, metavar="N", help="torch random seed (default: 0)"
    )
    gen.add_argument(
        "--device", metavar="DEVICE", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)"
    )
    gen.add_argument(
        "--dtype",
        choices=common.DTYPES,
        help="model weights' dtype (default: float32 on CPU, bfloat16 on GPU)",
    )
    gen.add_argument("--stats", action="store_true", help="print the SpeculationStats summary to stderr")
    gen.add_argument(
        "--compare-plain",
        action="store_true",
        help="also run plain model.generate: tokens/s of both and, for greedy runs, whether outputs are identical",
    )
    gen.add_argument(
        "--repeats",
        type=common.whole,
        default=3,
        metavar="N",
        help="--compare-plain: timed calls of each, after one warm-up call of each, interleaved; medians are "
        "compared (default: 3; 0 compares the first calls)",
    )
    gen.add_argument("--json", metavar="FILE", help="write prompts, outputs and stats to this JSON file")


def _prompts(args) -> list[str]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise UsageError("--prompt is empty: give some text, or leave --prompt out for the demo prompt")
        return [args.prompt]
    if args.prompt_file is None:
        return [DEFAULT_PROMPT]
    return common.read_prompt_file(args.prompt_file)


def _check(args):
    """Everything about the arguments that can be checked without a model: the prompts, the sampling settings
    and the speculation config."""
    prompts = _prompts(args)
    sampling = {
        name: value
        for name, value in dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).items()
        if value is not None
    }
    if sampling and not args.do_sample:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in sampling)
        verb = "needs" if len(sampling) == 1 else "need"
        raise UsageError(
            f"{flags} {verb} --do-sample (greedy decoding ignores them): add --do-sample or drop them"
        )
    max_k = SpeculationConfig().max_draft_tokens
    if not 0 <= args.num_draft_tokens <= max_k:
        raise UsageError(f"--num-draft-tokens must be in 0..{max_k}, got {args.num_draft_tokens}")
    if args.num_draft_tokens == 0 and args.k_policy == "constant":
        raise UsageError(
            "--num-draft-tokens 0 with --k-policy constant never drafts: use K >= 1, or --k-policy plain for the "
            "no-speculation baseline"
        )
    if args.repeats < 0:
        raise UsageError(f"--repeats must be 0 or more (timed calls of each with --compare-plain), got {args.repeats}")
    common.check_model("--model", args.model)
    common.check_model("--draft-model", args.draft_model)
    takes_draft = args.strategy == "auto" or _takes_draft_model(args.strategy)
    if args.draft_model is not None and not takes_draft:
        raise UsageError(
            f"--draft-model is used only by --strategy draft_model or auto: drop it or change --strategy "
            f"(now {args.strategy})"
        )
    if args.strategy != "auto" and takes_draft and args.model is not None and args.draft_model is None:
        raise UsageError(
            f"--strategy {args.strategy} needs --draft-model (a smaller model sharing the target's tokenizer)"
        )
    config = common.config(
        strategy=args.strategy, num_draft_tokens=args.num_draft_tokens, k_policy=args.k_policy,
        draft_weights=args.draft_weights,
    )  # fmt: skip
    common.check_output("--json", args.json)
    return prompts, sampling, config


def _takes_draft_model(strategy: str) -> bool:
    return resolve(DRAFTERS, strategy).takes_draft_model


def run(args) -> int:
    prompts, sampling, config = _check(args)
    device = common.device(args.device)

    import torch

    from .. import generate

    dtype = common.default_dtype(args.dtype, device)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path = common.demo_model("target")
        if draft_path is None and (args.strategy == "auto" or _takes_draft_model(args.strategy)):
            draft_path = common.demo_model("draft")
    tokenizer, model = common.load_model("--model", model_path, dtype, device)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    draft = common.load_model("--draft-model", draft_path, dtype, device)[1] if draft_path else None

    torch.manual_seed(args.seed)
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    if inputs["input_ids"].shape[1] == 0:
        raise UsageError("the prompt is empty after tokenization: give some text")
    options = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, **sampling)
    if args.repetition_penalty is not None:
        options["repetition_penalty"] = args.repetition_penalty

    def speculative():
        return model.generate(
            **inputs,
            **options,
            custom_generate=generate,
            speculation=config,
            draft_model=draft,
            return_dict_in_generate=True,
        )

    try:
        out = speculative()
    except (
        ValueError,
        NotImplementedError,
    ) as err:  # the library's checks: unsupported model, prompt too long
        raise UsageError(common.one_line(err)) from err
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
        "dtype": dtype,
    }
    if args.stats:
        print("-" * 80, file=sys.stderr)
        print(stats.summary(), file=sys.stderr)
    if args.compare_plain:
        record["plain"] = _compare_plain(
            model, inputs, options, out.sequences, stats, device, args.do_sample, speculative, args.repeats
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return 0


def _compare_plain(
    model, inputs, options: dict, sequences, stats, device: str, do_sample: bool, speculative, repeats: int
) -> dict:
    """Run plain ``model.generate`` with the same arguments; report speed and (for greedy runs) equality, and why
    speculation lost where it did. With ``repeats``, both are compared warm, as a benchmark compares them: plain
    ``generate`` gets one warm-up call (the speculative call above was this one's), then ``repeats`` rounds of one
    timed call of each, interleaved (drift of a shared machine hits both alike); the medians are compared. The
    first speculative call, which also pays this model's first planning, is reported beside them."""
    import torch

    def timed(call):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return result, time.perf_counter() - start

    plain, plain_s = timed(lambda: model.generate(**inputs, **options))
    new_tokens = (plain.shape[1] - inputs["input_ids"].shape[1]) * plain.shape[0]
    plain_tps, spec_tps = new_tokens / plain_s, stats.tokens_per_second
    if repeats:
        walls = {"plain": [], "speculative": []}
        for _ in range(repeats):
            out, wall = timed(speculative)
            walls["speculative"].append(sum(out.speculation.new_tokens) / wall)
            walls["plain"].append(new_tokens / timed(lambda: model.generate(**inputs, **options))[1])
        plain_tps, spec_tps = (statistics.median(walls[k]) for k in ("plain", "speculative"))
    same = plain.shape == sequences.shape and bool((plain == sequences).all())
    how = f" (median of {repeats} warm calls each)" if repeats else " (first calls)"
    speeds = f"plain generate: {plain_tps:.1f} tok/s, speculative: {spec_tps:.1f} tok/s{how}"
    if repeats:
        speeds += f"; the first speculative call: {stats.tokens_per_second:.1f} tok/s"
    if do_sample:
        note = (
            "sampling: the two runs draw different random numbers, so their outputs are not expected to match "
            "(both sample from the same distribution)"
        )
        print(f"{speeds}; {note}", file=sys.stderr)
    else:
        print(f"{speeds}, identical output: {same}", file=sys.stderr)
    if spec_tps < plain_tps:
        print(f"why speculation is slower here: {_why_slower(stats, device)}", file=sys.stderr)
    return {
        "wall_time_s": new_tokens / plain_tps,
        "tokens_per_second": plain_tps,
        "speculative_tokens_per_second": spec_tps,
        "first_call_tokens_per_second": stats.tokens_per_second,
        "repeats": repeats,
        "identical": same,
        "expected_identical": not do_sample,
    }


def _why_slower(stats, device: str) -> str:
    """One line from the call's own timings: where its steps spent their time."""
    timings = stats.to_dict()
    steps = max(int(timings.get("steps") or 0), 1)
    draft = 1000 * float(timings.get("draft_time_s") or 0.0) / steps
    verify = 1000 * float(timings.get("verify_time_s") or 0.0) / steps
    accepted = float(timings.get("mean_acceptance_length") or 0.0)
    where = (
        "on a CPU a step of a model this small costs about the same for 1 or K + 1 tokens and is mostly fixed "
        "per-call overhead, so drafting and verifying add more than the accepted tokens save"
        if device == "cpu"
        else "the step is not yet bound by reading weights or cache"
    )
    return (
        f"per step, drafting took {draft:.2f} ms and verifying {verify:.2f} ms for {accepted:.2f} tokens; {where}. "
        "Speculation pays where one step reads large weights or a long KV cache (a GPU, a big model, a long "
        "prompt): see docs/results.md"
    )
