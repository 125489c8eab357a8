"""Whole ``generate`` calls on the trained fixtures, every case of a shape side by side in one process.

Target ``code-target``, draft ``code-draft``, held-out prompts of ``prompts_long.jsonl`` cut to the shape's context
(rows cycle through the prompts when the batch is larger than their count), greedy. Each case runs one identical
warm-up call (it also captures the CUDA graphs of a new shape bucket, and gives plain ``generate`` its cuDNN plans),
then one timed call. Decode tokens/s = new tokens after each row's first / (wall - prefill - graph capture), from
``out.speculation``; call tokens/s = all new tokens / wall. Plain transformers (``transformers``) has only the
call figure.

Cases (``--cases``): ``k0`` (our K = 0 path), ``transformers`` (plain generate), ``STRATEGY:K`` (constant K),
``STRATEGY:utility``, ``auto``; a ``@torch`` suffix on ``prompt_lookup`` runs its device n-gram search on the
PyTorch reference instead of the Triton kernel (an A/B of the search).

    python benchmarks/bench_e2e.py --shapes 16x16384 --cases k0 transformers prompt_lookup:4 prompt_lookup@torch:4

Writes one record per (device, shape, case) to ``results/e2e.json`` (setting ``<device>:<B>x<L>:<case>``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hf_sparse_verify as hsv  # noqa: E402
from benchmarks import _records  # noqa: E402
from hf_sparse_verify.generation.drafters import prompt_lookup  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def prompts(path: Path, tokenizer, batch: int, context: int, device) -> torch.Tensor:
    """``[batch, context]`` ids: held-out prompts of at least ``context`` tokens, cut to ``context``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ids = [tokenizer(r["text"])["input_ids"] for r in rows]
    ids = [x[:context] for x in ids if len(x) >= context]
    if not ids:
        raise SystemExit(f"no prompt of {context} tokens in {path}")
    return torch.tensor([ids[i % len(ids)] for i in range(batch)], device=device)


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _generated(new: torch.Tensor, eos) -> int:
    """New tokens of plain ``generate``'s ``[B, T]`` output: each row up to and including its first EOS."""
    eos = torch.tensor(eos if isinstance(eos, list) else [eos], device=new.device)
    stop = torch.isin(new, eos)
    first = torch.where(stop.any(dim=1), stop.int().argmax(dim=1) + 1, new.shape[1])
    return int(first.sum())


def run_case(case: str, target, draft, ids, new_tokens: int, device) -> dict:
    """One warm-up call and one timed call of ``case``; the record's measured fields."""
    name, _, k = case.partition(":")
    strategy, _, search = name.partition("@")
    common = dict(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
    )
    if strategy == "transformers":
        for _ in range(2):
            _sync(device)
            start = time.perf_counter()
            out = target.generate(**common)
            _sync(device)
        wall = time.perf_counter() - start
        generated = _generated(out[:, ids.shape[1] :], target.generation_config.eos_token_id)
        return dict(strategy="transformers", k_policy=None, call_tokens_per_s=generated / wall, wall_s=wall)
    if strategy == "k0":
        spec, strategy, k_policy = dict(strategy="prompt_lookup", k_policy="plain"), "k0", "plain"
    elif k in ("utility", "heuristic"):
        spec, k_policy = dict(strategy=strategy, k_policy=k), k
    elif strategy == "auto":
        spec, k_policy = dict(strategy="auto"), "constant"
    else:
        spec, k_policy = (
            dict(strategy=strategy, num_draft_tokens=int(k), max_draft_tokens=max(16, int(k))),
            "constant",
        )
    kwargs = dict(custom_generate=hsv.generate, speculation=spec, return_dict_in_generate=True)
    if spec["strategy"] in ("draft_model", "auto"):
        kwargs["draft_model"] = draft
    prompt_lookup.DEVICE_SEARCH_KERNEL = False if search == "torch" else None
    try:
        for _ in range(2):  # warm-up, then the timed call
            out = target.generate(**common, **kwargs)
    finally:
        prompt_lookup.DEVICE_SEARCH_KERNEL = None
    s = out.speculation
    decode_s = s.wall_time_s - s.prefill_time_s - s.graph_capture_s
    generated = sum(s.new_tokens)
    steps = max(s.steps, 1)
    return dict(
        strategy=name if strategy != "k0" else "k0",
        k_policy=k_policy,
        num_draft_tokens=int(k) if k.isdigit() else None,
        decode_tokens_per_s=(generated - len(s.new_tokens)) / decode_s,
        call_tokens_per_s=generated / s.wall_time_s,
        mean_acceptance_length=s.to_dict()["mean_acceptance_length"],
        steps=s.steps,
        draft_ms=1000 * s.draft_time_s / steps,
        verify_ms=1000 * s.verify_time_s / steps,
        update_ms=1000 * s.update_time_s / steps,
        capture_s=s.graph_capture_s,
        prefill_s=s.prefill_time_s,
        wall_s=s.wall_time_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", nargs="+", default=["1x16384", "4x16384", "16x16384"], help="BxL, e.g. 16x16384"
    )
    parser.add_argument("--cases", nargs="+", default=["k0", "transformers", "prompt_lookup:4", "vegas:6"])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    _records.add_arguments(parser, "e2e")
    args = parser.parse_args()
    if args.setting:
        raise SystemExit("bench_e2e names each record itself (<device>:<shape>:<case>); drop --setting")
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    models = Path(args.shared) / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "code-target")
    target = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=dtype).to(args.device).eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "code-draft", dtype=dtype).to(args.device).eval()
    device_name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    for shape in args.shapes:
        batch, context = (int(x) for x in shape.split("x"))
        ids = prompts(models / "prompts_long.jsonl", tokenizer, batch, context, args.device)
        results = {}
        for case in tqdm(args.cases, desc=shape, unit="case"):
            results[case] = run_case(case, target, draft, ids, args.new_tokens, args.device)
        k0 = results.get("k0", {}).get("decode_tokens_per_s")
        plain = results.get("transformers", {}).get("call_tokens_per_s")
        for case, result in results.items():
            record = dict(
                device=device_name, shape=shape, batch=batch, context=context, new_tokens=args.new_tokens
            )
            record.update(result)
            if k0 and "decode_tokens_per_s" in result:
                record["vs_k0"] = result["decode_tokens_per_s"] / k0
            if plain:
                record["vs_plain"] = result["call_tokens_per_s"] / plain
            setting = f"{args.device.split(':')[0]}:{shape}:{case}"
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()}))
            _records.save(args, record, args.device, setting=setting)


if __name__ == "__main__":
    main()
