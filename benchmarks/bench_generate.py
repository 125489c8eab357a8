"""End-to-end tokens/s: plain ``model.generate`` vs hf_sparse_verify, side by side in one process.

Suites:
- ``fixtures``: the trained ``code-target`` with ``prompt_lookup`` and with ``code-draft`` as draft model, on
  held-out prompts of ``prompts.jsonl`` at 1K and 4K tokens (greedy). Reports tokens/s, the ratio to plain
  generate, mean acceptance length, and the share of outputs identical to plain generate. ``--check-fp32``
  additionally runs a float32 copy and asserts token-for-token equality.
- ``8b``: a Llama-3.1-8B-shaped model with random bf16 weights (timings do not depend on weight values; the
  acceptance of random weights means nothing) at 1K and 16K context: plain generate vs our K = 0 path
  (``k_policy="plain"``) vs K = 4 with a tiny random draft model (always 4 drafts, so the step cost of a K = 4
  verify is what is measured).

Each configuration runs once to warm up, then ``--repeats`` times; the median is reported. JSON goes to
``--json`` with the machine, versions and commit.

    python benchmarks/bench_generate.py --suite fixtures --device cpu    # record "fixtures_cpu" of results/generate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.machine import machine_info as package_machine_info
from hf_sparse_verify.drivers.shapes import SHAPES

ROOT = Path(__file__).resolve().parents[1]


def machine_info(device: str) -> dict:
    """The package's machine facts (`hf_sparse_verify.drivers.machine`) plus the CPU thread count."""
    return {**package_machine_info(torch.device(device)), "cpu_threads": torch.get_num_threads()}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_generate(model, inputs, device, repeats, **kwargs):
    """(median seconds, last output) over ``repeats`` runs after one warm-up."""
    times, out = [], None
    for i in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        out = model.generate(**inputs, **kwargs)
        _sync(device)
        if i > 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times), out


def _sequences(out):
    return out.sequences if hasattr(out, "sequences") else out


def run_case(name, model, inputs, device, repeats, new_tokens, plain_s, plain_out, **spec_kwargs) -> dict:
    seconds, out = timed_generate(
        model,
        inputs,
        device,
        repeats,
        max_new_tokens=new_tokens,
        do_sample=False,
        custom_generate=hsv.generate,
        return_dict_in_generate=True,
        **spec_kwargs,
    )
    batch, prompt = inputs["input_ids"].shape
    produced = (out.sequences.shape[1] - prompt) * batch
    plain_produced = (plain_out.shape[1] - prompt) * batch
    stats = out.speculation
    return {
        "case": name,
        "tokens_per_s": produced / seconds,
        "plain_tokens_per_s": plain_produced / plain_s,
        "ratio_to_plain": (produced / seconds) / (plain_produced / plain_s),
        "seconds": seconds,
        "plain_seconds": plain_s,
        "identical_to_plain": bool(
            out.sequences.shape == plain_out.shape and torch.equal(out.sequences, plain_out)
        ),
        "mean_acceptance_length": stats.mean_acceptance_length,
        "steps": stats.steps,
        "draft_time_s": stats.draft_time_s,
        "verify_time_s": stats.verify_time_s,
    }


# --------------------------------------------------------------------------------------------------- fixtures
def suite_fixtures(args, device, dtype) -> list[dict]:
    shared = Path(args.shared) / "models"
    target = AutoModelForCausalLM.from_pretrained(shared / "code-target", dtype=dtype).to(device).eval()
    draft = (
        None  # the draft-model cases run only where code-draft is present (device copies may leave it out)
    )
    if (shared / "code-draft").is_dir():
        draft = AutoModelForCausalLM.from_pretrained(shared / "code-draft", dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    prompts = [json.loads(line) for line in open(shared / "prompts.jsonl")]
    records = []
    cases = [(length, p["text"]) for length in args.fixture_lengths for p in prompts if p["len"] == length]
    per_length: dict[int, int] = {}
    selected = []
    for length, text in cases:
        if per_length.get(length, 0) < args.prompts_per_length:
            per_length[length] = per_length.get(length, 0) + 1
            selected.append((length, text))
    for length, text in tqdm(selected, desc="fixtures", file=sys.stdout):
        inputs = tok(text, return_tensors="pt").to(device)
        plain_s, plain_out = timed_generate(
            target, inputs, device, args.repeats, max_new_tokens=args.new_tokens, do_sample=False
        )
        common = (target, inputs, device, args.repeats, args.new_tokens, plain_s, plain_out)
        for name, kwargs in [
            ("k0_plain_policy", dict(speculation=dict(k_policy="plain"))),
            ("prompt_lookup_k4", dict(speculation=dict(strategy="prompt_lookup", num_draft_tokens=4))),
            ("prompt_lookup_k8", dict(speculation=dict(strategy="prompt_lookup", num_draft_tokens=8))),
            ("prompt_lookup_utility", dict(speculation=dict(strategy="prompt_lookup", k_policy="utility"))),
            (
                "draft_model_k4",
                dict(speculation=dict(strategy="draft_model", num_draft_tokens=4), draft_model=draft),
            ),
            ("vegas_k6", dict(speculation=dict(strategy="vegas", num_draft_tokens=6))),
        ]:
            if name.startswith("draft_model") and draft is None:
                continue
            record = run_case(name, *common, **kwargs)
            record.update(
                model="code-target", context=int(inputs["input_ids"].shape[1]), prompt_len_class=length
            )
            records.append(record)
    if args.check_fp32:
        records.extend(fp32_equality(target, draft, tok, selected, device, args.new_tokens))
    return records


def fp32_equality(target, draft, tok, selected, device, new_tokens) -> list[dict]:
    target32 = target.float()
    draft32 = draft.float() if draft is not None else None
    out = []
    for length, text in selected[:4]:
        inputs = tok(text, return_tensors="pt").to(device)
        plain = target32.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
        for strategy in ("prompt_lookup", "draft_model") if draft is not None else ("prompt_lookup",):
            ours = target32.generate(
                **inputs,
                max_new_tokens=new_tokens,
                do_sample=False,
                custom_generate=hsv.generate,
                speculation=dict(strategy=strategy, num_draft_tokens=4),
                draft_model=draft32 if strategy == "draft_model" else None,
            )
            out.append(
                {
                    "case": f"fp32_equality_{strategy}",
                    "prompt_len_class": length,
                    "identical_to_plain": bool(ours.shape == plain.shape and torch.equal(ours, plain)),
                }
            )
    target.to(torch.bfloat16)
    if draft is not None:
        draft.to(torch.bfloat16)
    return out


# ------------------------------------------------------------------------------------------------------- 8B
LLAMA_8B = {
    **SHAPES["llama-3.1-8b"][1],
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "pad_token_id": 128001,
}


def random_model(config_kwargs: dict, device: str, dtype) -> torch.nn.Module:
    config = LlamaConfig(**config_kwargs)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def suite_8b(args, device, dtype) -> list[dict]:
    target = random_model(LLAMA_8B, device, dtype)
    draft = random_model(
        {
            **LLAMA_8B,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        device,
        dtype,
    )
    gen = torch.Generator().manual_seed(0)
    records = []
    for context in tqdm(args.contexts_8b, desc="8b", file=sys.stdout):
        ids = torch.randint(0, LLAMA_8B["vocab_size"], (1, context), generator=gen).to(device)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        plain_s, plain_out = timed_generate(
            target, inputs, device, args.repeats, max_new_tokens=args.new_tokens, do_sample=False
        )
        common = (target, inputs, device, args.repeats, args.new_tokens, plain_s, plain_out)
        for name, kwargs in [
            ("k0_plain_policy", dict(speculation=dict(k_policy="plain"))),
            (
                "draft_model_k4_random",
                dict(speculation=dict(strategy="draft_model", num_draft_tokens=4), draft_model=draft),
            ),
        ]:
            record = run_case(name, *common, **kwargs)
            record.update(model="llama-3.1-8b-shape-random-bf16", context=context)
            records.append(record)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["fixtures", "8b", "all"], default="fixtures")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument("--fixture-lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--prompts-per-length", type=int, default=3)
    parser.add_argument("--contexts-8b", type=int, nargs="+", default=[1024, 16384])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--check-fp32", action="store_true")
    _records.add_arguments(parser, "generate")
    args = parser.parse_args()
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    )
    result = {"machine": machine_info(args.device), "args": vars(args), "dtype": str(dtype), "records": []}
    if args.suite in ("fixtures", "all"):
        result["records"] += suite_fixtures(args, args.device, dtype)
    if args.suite in ("8b", "all"):
        result["records"] += suite_8b(args, args.device, dtype)
    _records.save(args, result, args.device, setting=args.suite + ("_cpu" if args.device == "cpu" else ""))
    print(summarize(result))


def summarize(result: dict) -> str:
    rows = {}
    for r in result["records"]:
        if "tokens_per_s" not in r:
            continue
        key = (r["model"], r.get("prompt_len_class", r["context"]), r["case"])
        rows.setdefault(key, []).append(r)
    lines = [
        f"{'model':34} {'ctx':>6} {'case':24} {'tok/s':>8} {'plain':>8} {'ratio':>6} {'MAL':>5} {'same':>5}"
    ]
    for (model, ctx, case), rs in rows.items():
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        same = sum(x["identical_to_plain"] for x in rs)
        lines.append(
            f"{model:34} {ctx:>6} {case:24} {med['tokens_per_s']:8.1f} {med['plain_tokens_per_s']:8.1f} "
            f"{med['ratio_to_plain']:6.2f} {med['mean_acceptance_length']:5.2f} {same:>2}/{len(rs)}"
        )
    fp32 = [r for r in result["records"] if r["case"].startswith("fp32_equality")]
    if fp32:
        lines.append(f"fp32 equality: {sum(r['identical_to_plain'] for r in fp32)}/{len(fp32)} identical")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
