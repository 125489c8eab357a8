"""The hf-sparse-verify command: speculative generation, tuning and step benchmarks.

  hf-sparse-verify generate     generate text with speculative decoding (offline demo pair without --model)
  hf-sparse-verify tune         tune ratio and K of the self-speculative strategies (vegas, streaming, quest)
  hf-sparse-verify bench step   time one decode/verify step against transformers (meant for a GPU)

A mistake in the arguments ends with exit status 2 and one line saying what to change, checked before any model
loads where possible; add --debug to see the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..config import ATTENTION_BACKENDS, SELECTIONS, SpeculationConfig, check_model_location
from ..registry import DRAFTERS, K_POLICIES

DTYPES = ("float32", "bfloat16", "float16")
STRATEGY_HELP = {
    "auto": "draft_model when a draft model is given, else prompt_lookup",
    "prompt_lookup": "n-gram lookup in the prompt and the output so far (no extra model)",
    "draft_model": "a smaller model sharing the tokenizer drafts (--draft-model)",
    "vegas": "the target drafts for itself with sparse attention picked by its own verify scores",
    "streaming": "self-speculation over sink tokens plus a recent window",
    "quest": "self-speculation over pages picked by query-aware page summaries",
}
K_POLICY_HELP = {
    "constant": "K = --num-draft-tokens at every step",
    "heuristic": "transformers' rule: K + 2 after a fully accepted draft, K - 1 otherwise",
    "utility": "Cascade: measures tokens per step over step time and picks K, or switches speculation off",
    "plain": "K = 0 at every step: plain decoding through this engine (a baseline)",
}
# ends mid-line: the demo tokenizer merges a newline with the next line's indentation
DEFAULT_PROMPT = "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"


class UsageError(Exception):
    """A mistake in the command line; `main` prints it as one line and exits with status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line (``prog: error: ...; see prog --help``) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -------------------------------------------------------------------------------------------- argument types
def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _probability(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4, got {text!r}"
        ) from None


def _table(title: str, rows: dict[str, str]) -> str:
    width = max(map(len, rows)) + 2
    return f"{title}:\n" + "".join(f"  {name:<{width}}{meaning}\n" for name, meaning in rows.items())


# ------------------------------------------------------------------------------------------------- the parser
def _build_parser() -> argparse.ArgumentParser:
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument(
        "--debug", action="store_true", help="show the traceback of an error instead of one line"
    )
    parser = _Parser(
        prog="hf-sparse-verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{generate,tune,bench}")
    _add_generate_parser(sub, debug)
    _add_tune_parser(sub, debug)
    _add_bench_parser(sub, debug)
    _add_calibrate_parser(sub, debug)
    return parser


def _add_generate_parser(sub, debug) -> None:
    gen = sub.add_parser(
        "generate",
        parents=[debug],
        help="generate text with speculative decoding",
        description="Generate text with speculative decoding. Without --model it runs the embedded demo pair\n"
        "(a 2.4M-parameter target and a 0.8M draft trained on Python code), offline. Greedy output equals\n"
        "plain model.generate token for token.",
        epilog=_table("strategies (--strategy)", STRATEGY_HELP)
        + "\n"
        + _table("K policies (--k-policy)", K_POLICY_HELP)
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
        "--num-draft-tokens",
        type=_int,
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
        type=_positive_int,
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
        type=_positive_float,
        metavar="T",
        help="sampling temperature (needs --do-sample; default: the model's)",
    )
    gen.add_argument(
        "--top-k",
        type=_positive_int,
        metavar="K",
        help="sample from the k most likely tokens (needs --do-sample)",
    )
    gen.add_argument(
        "--top-p", type=_probability, metavar="P", help="nucleus sampling mass in (0, 1] (needs --do-sample)"
    )
    gen.add_argument(
        "--repetition-penalty",
        type=_positive_float,
        metavar="R",
        help="penalty > 1 discourages repeats (default: none)",
    )
    gen.add_argument("--seed", type=_int, default=0, metavar="N", help="torch random seed (default: 0)")
    gen.add_argument(
        "--device", metavar="DEVICE", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)"
    )
    gen.add_argument(
        "--dtype", choices=DTYPES, help="model weights' dtype (default: float32 on CPU, bfloat16 on GPU)"
    )
    gen.add_argument("--stats", action="store_true", help="print the SpeculationStats summary to stderr")
    gen.add_argument(
        "--compare-plain",
        action="store_true",
        help="also run plain model.generate: tokens/s of both and, for greedy runs, whether outputs are identical",
    )
    gen.add_argument("--json", metavar="FILE", help="write prompts, outputs and stats to this JSON file")


def _add_tune_parser(sub, debug) -> None:
    from ..drivers.tune import (
        DEFAULT_K_LARGE,
        DEFAULT_KS,
        DEFAULT_RATIOS,
        MIN_GAIN,
        RATIO_STRATEGIES,
        REFINE_FACTORS,
    )

    tune = sub.add_parser(
        "tune",
        parents=[debug],
        help="tune ratio and K of vegas/streaming/quest (the Vegas paper's three steps)",
        description="(1) sweep the ratio at a large K until the mean acceptance length stops rising, (2) sweep K "
        "at that ratio for decode tokens/s, (3) refine the ratio at that K; saves speculation_config.json, "
        "tune_measurements.json and tune_sweep.png into --out.",
    )
    tune.add_argument("--strategy", default="vegas", choices=RATIO_STRATEGIES, help="(default: vegas)")
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
        "--prompt-len", type=_positive_int, help="keep only .jsonl lines whose 'len' equals this"
    )
    tune.add_argument(
        "--max-prompts", type=_positive_int, help="use at most this many prompts (default: all)"
    )
    tune.add_argument("--max-new-tokens", type=_positive_int, default=64, help="(default: 64)")
    tune.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    tune.add_argument("--dtype", choices=DTYPES, help="(default: float32 on CPU, bfloat16 on GPU)")
    tune.add_argument("--out", default="tuned", help="output folder (default: ./tuned)")
    tune.add_argument(
        "--k-large",
        type=_positive_int,
        default=DEFAULT_K_LARGE,
        help=f"K of step 1 (default: {DEFAULT_K_LARGE})",
    )
    tune.add_argument(
        "--ratios",
        type=_probability,
        nargs="+",
        default=list(DEFAULT_RATIOS),
        help=f"step 1 ratios (default: {' '.join(map(str, DEFAULT_RATIOS))})",
    )
    tune.add_argument(
        "--ks",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_KS),
        help=f"step 2 K values (default: {' '.join(map(str, DEFAULT_KS))})",
    )
    tune.add_argument(
        "--refine-factors",
        type=_positive_float,
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
        "--min-tokens", type=_positive_int, default=256, help="min_tokens of the budget (default: 256)"
    )
    tune.add_argument(
        "--selection", default="two_rows", choices=SELECTIONS, help="vegas scores (default: two_rows)"
    )
    tune.add_argument(
        "--attention-backend", default="auto", choices=ATTENTION_BACKENDS, help="(default: auto)"
    )
    tune.add_argument("--no-warmup", action="store_true", help="skip the warm-up call")


def _add_calibrate_parser(sub, debug) -> None:
    cal = sub.add_parser(
        "calibrate",
        parents=[debug],
        help="calibrate LOSSY sparse verification (anchor layers, FFN thresholds, expert skipping) for a model",
        description="Runs the prompts through the model (prefill, then one dense verify step of the last "
        "--verify-tokens tokens each) and writes sparse_verify_calibration.json: per-layer block-selection "
        "similarities (anchor layers), FFN activation thresholds for channel sparsities 0.05..0.95, and for MoE "
        "models expert-skipping threshold maps, refusing a setting whose NLL damage passes --moe-max-damage.",
    )
    cal.add_argument("--model", help="model folder or Hub id (default: the embedded demo target)")
    cal.add_argument(
        "--prompt-file", required=True, metavar="FILE", help='text file or .jsonl with {"text": ...}'
    )
    cal.add_argument(
        "--prompt-len", type=_positive_int, help="keep only .jsonl lines whose 'len' equals this"
    )
    cal.add_argument("--max-prompts", type=_positive_int, default=16, help="(default: 16)")
    cal.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=8192,
        help="cut prompts to this many tokens (default: 8192)",
    )
    cal.add_argument(
        "--verify-tokens", type=_positive_int, default=8, help="verify tokens per prompt (default: 8)"
    )
    cal.add_argument(
        "--block-size", type=_positive_int, default=64, help="attention block size (default: 64)"
    )
    cal.add_argument("--rho", type=_probability, default=0.1, help="attention rho (default: 0.1)")
    cal.add_argument("--dense-below", type=int, default=4096, help="attention L0 (default: 4096)")
    cal.add_argument("--no-ffn", action="store_true", help="skip the FFN thresholds")
    cal.add_argument(
        "--moe-rule",
        default="threshold",
        choices=("threshold", "budget", "row_union"),
        help="(default: threshold)",
    )
    cal.add_argument(
        "--moe-row-experts",
        type=_positive_int,
        help="experts per verify row for --moe-rule row_union (e.g. 8)",
    )
    cal.add_argument(
        "--moe-max-skip", type=_positive_int, default=1, help="experts skipped at most (default: 1)"
    )
    cal.add_argument("--moe-max-damage", type=_positive_float, default=0.05, help="NLL bound (default: 0.05)")
    cal.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    cal.add_argument("--dtype", choices=DTYPES, help="(default: float32 on CPU, bfloat16 on GPU)")
    cal.add_argument("--out", help="output folder (default: the model folder when local, else ./calibration)")


def _add_bench_parser(sub, debug) -> None:
    from ..drivers.shapes import SHAPES

    bench = sub.add_parser("bench", parents=[debug], help="benchmarks (needs a GPU for meaningful numbers)")
    kinds = bench.add_subparsers(dest="bench_command", required=True, metavar="{step}")
    step = kinds.add_parser(
        "step",
        parents=[debug],
        help="time one decode/verify forward: our fast path vs transformers eager vs the bandwidth floor",
        description="Builds a random-weight model of a named shape, measures the copy bandwidth, then times one "
        "forward step per (context, new tokens, batch) with our fast path (CUDA graphs + Triton attention) and "
        "with plain transformers eager; writes machine, versions and records with ours_ms, transformers_ms and "
        "floor_ms.",
    )
    step.add_argument("--shape", required=True, choices=sorted(SHAPES), help="model shape preset")
    step.add_argument(
        "--context", type=_int_list, default=(1024,), help="cached tokens, e.g. 1024,65536 (default: 1024)"
    )
    step.add_argument(
        "--new-tokens", type=_int_list, default=(1, 2, 4, 8, 16), help="e.g. 1,2,4,8,16 (the default)"
    )
    step.add_argument("--batch", type=_int_list, default=(1,), help="rows, e.g. 1 or 8,32 (default: 1)")
    step.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    step.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="(default: bfloat16)")
    step.add_argument(
        "--repeats", type=_positive_int, default=10, help="timed calls per record, median (default: 10)"
    )
    step.add_argument("--no-transformers", action="store_true", help="skip the transformers baseline")
    step.add_argument("--no-cuda-graphs", action="store_true", help="time our eager path instead")
    step.add_argument(
        "--vegas-scores", action="store_true", help="also time verify steps that collect Vegas' scores"
    )
    step.add_argument("--json", help="write the result JSON here")


# ------------------------------------------------------------------------------------ checks before loading
def read_prompt_file(path: str, flag: str = "--prompt-file") -> list[str]:
    """Prompts of a text file (the whole file is one prompt) or a ``.jsonl`` file (``{"text": ...}`` per line).

    Every problem raises a `UsageError` naming the file, the line and what to change.

    Example:
        >>> import os, tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        ...     _ = f.write('{"text": "def f():"}\\n\\n{"text": "import os"}\\n')
        >>> read_prompt_file(f.name)
        ['def f():', 'import os']
        >>> os.remove(f.name)
    """
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path!r}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a folder: give a text file or a .jsonl file")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path!r} is not UTF-8 text: give a text file or a .jsonl file") from None
    if not path.endswith(".jsonl"):
        if not text.strip():
            raise UsageError(f"{flag} {path!r} is empty: write the prompt into it")
        return [text]
    prompts = []
    example = '{"text": "your prompt"}'
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{flag} {path!r} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(
                f"{where}: not valid JSON ({err.msg}); write one object per line like {example}"
            ) from None
        if not isinstance(row, dict) or "text" not in row:
            raise UsageError(f'{where} has no "text" field: write one object per line like {example}')
        if not isinstance(row["text"], str) or not row["text"]:
            raise UsageError(f'{where}: "text" must be a non-empty string, got {row["text"]!r}')
        prompts.append(row["text"])
    if not prompts:
        raise UsageError(f"{flag} {path!r} holds no prompts: write one object per line like {example}")
    return prompts


def _prompts(args) -> list[str]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise UsageError("--prompt is empty: give some text, or leave --prompt out for the demo prompt")
        return [args.prompt]
    if args.prompt_file is None:
        return [DEFAULT_PROMPT]
    return read_prompt_file(args.prompt_file)


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device: use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {name}: this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu, or install a "
            "CUDA build of torch on a GPU machine"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    return name


def _check_model(flag: str, path: str | None) -> None:
    if path is None:
        return
    try:
        check_model_location(flag, path)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _check_output(flag: str, path: str | None) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(
            f"{flag} {path!r}: the folder {folder!r} does not exist; create it or pick another path"
        )


def _config(**fields) -> SpeculationConfig:
    try:
        return SpeculationConfig(**fields)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _load(what: str, path: str, loader):
    """``loader(path)``; a failure to load (no such Hub repo, no network, not a model folder) is a usage error."""
    try:
        return loader(path)
    except (OSError, ValueError) as err:
        raise UsageError(f"{what} {path!r} could not be loaded: {_one_line(err)}") from err


# ------------------------------------------------------------------------------------------------- commands
def _check_generate(args) -> tuple[list[str], dict, SpeculationConfig]:
    """Everything about ``generate``'s arguments that can be checked without a model: the prompts, the
    sampling settings and the speculation config."""
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
    _check_model("--model", args.model)
    _check_model("--draft-model", args.draft_model)
    if args.draft_model is not None and args.strategy not in ("auto", "draft_model"):
        raise UsageError(
            f"--draft-model is used only by --strategy draft_model or auto: drop it or change --strategy "
            f"(now {args.strategy})"
        )
    if args.strategy == "draft_model" and args.model is not None and args.draft_model is None:
        raise UsageError(
            "--strategy draft_model needs --draft-model (a smaller model sharing the target's tokenizer)"
        )
    config = _config(strategy=args.strategy, num_draft_tokens=args.num_draft_tokens, k_policy=args.k_policy)
    _check_output("--json", args.json)
    return prompts, sampling, config


def cmd_generate(args) -> int:
    prompts, sampling, config = _check_generate(args)
    device = _device(args.device)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import default_model_path, generate

    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    dtype = getattr(torch, dtype_name)
    model_path, draft_path = args.model, args.draft_model
    if model_path is None:
        model_path = os.path.join(default_model_path(), "target")
        if draft_path is None and args.strategy in ("auto", "draft_model"):
            draft_path = os.path.join(default_model_path(), "draft")

    def load_model(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()

    tokenizer = _load("--model", model_path, AutoTokenizer.from_pretrained)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = _load("--model", model_path, load_model)
    draft = _load("--draft-model", draft_path, load_model) if draft_path else None

    torch.manual_seed(args.seed)
    inputs = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    if inputs["input_ids"].shape[1] == 0:
        raise UsageError("the prompt is empty after tokenization: give some text")
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, **sampling)
    if args.repetition_penalty is not None:
        common["repetition_penalty"] = args.repetition_penalty
    try:
        out = model.generate(
            **inputs,
            **common,
            custom_generate=generate,
            speculation=config,
            draft_model=draft,
            return_dict_in_generate=True,
        )
    except (
        ValueError,
        NotImplementedError,
    ) as err:  # the library's checks: unsupported model, prompt too long
        raise UsageError(_one_line(err)) from err
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
        record["plain"] = _compare_plain(model, inputs, common, out.sequences, stats, device, args.do_sample)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    return 0


def _compare_plain(model, inputs, common: dict, sequences, stats, device: str, do_sample: bool) -> dict:
    """Run plain ``model.generate`` with the same arguments; report speed and (for greedy runs) equality."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    plain = model.generate(**inputs, **common)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    plain_s = time.perf_counter() - start
    plain_tps = (plain.shape[1] - inputs["input_ids"].shape[1]) * plain.shape[0] / plain_s
    same = plain.shape == sequences.shape and bool((plain == sequences).all())
    speeds = f"plain generate: {plain_tps:.1f} tok/s, speculative: {stats.tokens_per_second:.1f} tok/s"
    if do_sample:
        note = (
            "sampling: the two runs draw different random numbers, so their outputs are not expected to match "
            "(both sample from the same distribution)"
        )
        print(f"{speeds}; {note}", file=sys.stderr)
    else:
        print(f"{speeds}, identical output: {same}", file=sys.stderr)
    return {
        "wall_time_s": plain_s,
        "tokens_per_second": plain_tps,
        "identical": same,
        "expected_identical": not do_sample,
    }


def _tuning_prompts(args) -> list:
    """The ``--prompt-file`` prompts of ``tune`` and ``calibrate`` (``--prompt-len``, ``--max-prompts``); format
    errors as one line, before anything loads."""
    from ..drivers.tune import read_prompts

    read_prompt_file(args.prompt_file)
    try:
        return read_prompts(args.prompt_file, args.prompt_len, args.max_prompts)
    except ValueError as err:
        raise UsageError(_one_line(err)) from None


def cmd_tune(args) -> int:
    from ..drivers.tune import dense_warning, tune

    prompts = _tuning_prompts(args)
    _check_model("--model", args.model)
    if args.draft_model is not None:
        raise UsageError(f"--draft-model: {args.strategy} drafts with the target itself; drop --draft-model")
    base = _config(
        strategy=args.strategy,
        min_tokens=args.min_tokens,
        selection=args.selection,
        attention_backend=args.attention_backend,
    )
    device = _device(args.device)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import default_model_path

    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    model_path = args.model or os.path.join(default_model_path(), "target")

    def load_model(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype_name)).to(device).eval()

    tokenizer = _load("--model", model_path, AutoTokenizer.from_pretrained)
    model = _load("--model", model_path, load_model)
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    print(
        f"{len(prompts)} prompt(s) of {min(lengths)}-{max(lengths)} tokens, {model_path}, {device} {dtype_name}"
    )
    warning = dense_warning(lengths, args.ratios, args.min_tokens)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    try:
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
            warmup=not args.no_warmup,
            out_dir=args.out,
            meta={"model": model_path, "device": device, "dtype": dtype_name},
        )
    except (
        ValueError,
        NotImplementedError,
    ) as err:  # the library's checks: unsupported model, prompt too long
        raise UsageError(_one_line(err)) from err
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
    from ..drivers.step_bench import StepBenchArgs
    from ..drivers.step_bench import main as bench_step

    _check_output("--json", args.json)
    device = _device(args.device)
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
        raise UsageError(_one_line(err)) from None
    bench_step(bench_args, args.json)
    return 0


def cmd_calibrate(args) -> int:
    prompts = _tuning_prompts(args)
    _check_model("--model", args.model)
    device = _device(args.device)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .. import default_model_path
    from ..sparse import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE
    from ..sparse.calibration import calibrate

    dtype_name = args.dtype or ("float32" if device == "cpu" else "bfloat16")
    model_path = args.model or os.path.join(default_model_path(), "target")
    out = args.out or (model_path if os.path.isdir(model_path) else "calibration")

    def load_model(path):
        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype_name)).to(device).eval()

    tokenizer = _load("--model", model_path, AutoTokenizer.from_pretrained)
    model = _load("--model", model_path, load_model)
    ids = [tokenizer(p, return_tensors="pt")["input_ids"][0, : args.max_tokens] for p in prompts]
    ids = [t for t in ids if t.numel() > args.verify_tokens]
    if not ids:
        raise UsageError(f"--prompt-file: no prompt longer than --verify-tokens={args.verify_tokens} tokens")
    from ..integrations import replaceable_mlp

    is_moe = getattr(model.config.get_text_config(), "num_experts_per_tok", None) is not None
    has_ffn = any(replaceable_mlp(m) for m in model.modules())
    try:
        cfg = LossySparseVerify(
            attention=SparseAttention(block_size=args.block_size, rho=args.rho, dense_below=args.dense_below),
            ffn=SparseFFN() if has_ffn and not args.no_ffn else None,
            moe=SparseMoE(
                rule=args.moe_rule,
                max_skip=args.moe_max_skip,
                row_experts=args.moe_row_experts,
                max_damage=args.moe_max_damage,
            )
            if is_moe
            else None,
        )
        result = calibrate(model, ids, cfg, verify_tokens=args.verify_tokens)
    except ValueError as err:
        raise UsageError(_one_line(err)) from err
    path = result.save(out)
    anchors = result.anchor_layers(cfg.attention)
    print(f"{len(ids)} prompt(s), {model_path}, {device} {dtype_name}")
    print(f"anchor layers (a quarter of {result.num_layers}): {anchors}")
    if result.ffn:
        taus = result.ffn_thresholds(SparseFFN(sparsity=0.5))
        print("ffn tau at sparsity 0.5: " + " ".join(f"{t:.3g}" for t in taus if t is not None))
    if result.moe:
        print(f"moe damage: {result.moe.get('damage')}")
    print(f"saved {path}")
    return 0


COMMANDS = {"generate": cmd_generate, "tune": cmd_tune, "bench": cmd_bench, "calibrate": cmd_calibrate}


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Example:
        >>> main(["generate", "--prompt", ""])
        2
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    prog = " ".join([parser.prog, args.command, getattr(args, "bench_command", "")]).strip()
    try:
        return COMMANDS[args.command](args)
    except UsageError as err:
        if args.debug:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
