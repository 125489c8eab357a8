"""Command-line tool: ``hf-sparse-verify generate ...``.

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
    return parser


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


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "generate":
        return cmd_generate(args)
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    raise SystemExit(main())
