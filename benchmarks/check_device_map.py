"""Multi-GPU check: an 8B-shaped model dispatched by accelerate over every visible GPU (the balanced map that
``device_map="auto"`` resolves to), greedy output of hf_sparse_verify equal to plain ``generate``.

Random float32 weights (equality is tested in float32, see the README), or a trained checkpoint (``--model``).
``--max-memory`` forces a split, e.g. CPU offload on one GPU. Writes a JSON report.

    python benchmarks/check_device_map.py --setting x2_8b_fp32
    python benchmarks/check_device_map.py --model ../shared/models/code-target --max-memory '{"0": "20MiB", "cpu": "4GiB"}' \
        --setting offload_8b
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from accelerate import dispatch_model, infer_auto_device_map, init_empty_weights
from accelerate.utils import get_balanced_memory, set_module_tensor_to_device
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_generate import LLAMA_8B, machine_info

CASES = (
    ("prompt_lookup", {}),
    ("draft_model", {}),  # the target drafts for itself: the draft path on a split model
    ("vegas", {}),
    ("streaming", {}),
    ("quest", {}),
    ("prompt_lookup", {"k_policy": "utility", "max_draft_tokens": 8}),
)


def prompts(vocab: int, pad_id: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batch 1 and a ragged batch of 3 (left padding 0 / 37 / 74), the same on every rank; the last 64 tokens
    repeat the 64 before them, so prompt lookup has matches to draft from."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for batch in (1, 3):
        ids = torch.randint(0, vocab, (batch, 256), generator=gen)
        ids[:, -64:] = ids[:, -128:-64].clone()
        mask = torch.ones_like(ids)
        for row in range(batch):
            mask[row, : 37 * row] = 0
        ids[mask == 0] = pad_id
        out.append((ids.to(device), mask.to(device)))
    return out


def dispatched_random_model(config: LlamaConfig, dtype: torch.dtype, seed: int = 0, max_memory=None):
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    no_split = model._no_split_modules
    memory = max_memory or get_balanced_memory(model, dtype=dtype, no_split_module_classes=no_split)
    device_map = infer_auto_device_map(
        model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype
    )
    torch.manual_seed(seed)
    for name, param in list(model.named_parameters()):
        owner = max((k for k in device_map if name.startswith(k + ".") or k == name or k == ""), key=len)
        device = device_map[owner]
        if "norm" in name:
            value = torch.ones(param.shape, dtype=dtype, device=device)
        else:
            value = torch.randn(param.shape, dtype=dtype, device=device).mul_(0.02)
        set_module_tensor_to_device(model, name, device, value=value)
    model = dispatch_model(model, device_map=device_map)
    return model.eval(), device_map


def main() -> None:
    parser = argparse.ArgumentParser()
    _records.add_arguments(parser, "device_map")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument(
        "--speculation", default="{}", help="JSON of SpeculationConfig fields added to every case"
    )
    parser.add_argument(
        "--max-memory",
        default=None,
        help='JSON of accelerate max_memory, e.g. \'{"0": "6GiB", "cpu": "64GiB"}\' to force a split (CPU offload '
        "on one GPU); default: balanced over every visible GPU",
    )
    parser.add_argument(
        "--model", default=None, help="a trained checkpoint folder instead of the random 8B shape"
    )
    parser.add_argument("--warm", action="store_true", help="time each call's second run")
    parser.add_argument(
        "--strategies",
        nargs="+",
        choices=("prompt_lookup", "draft_model", "vegas", "streaming", "quest", "utility"),
        help="run only these cases (utility: prompt lookup with the utility K policy); default: all",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="float32 for equality; bfloat16 for times (bf16 outputs may differ at near-ties)",
    )
    args = parser.parse_args()

    max_memory = args.max_memory and {
        (int(k) if k.isdigit() else k): v for k, v in json.loads(args.max_memory).items()
    }
    start = time.time()
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, dtype=getattr(torch, args.dtype), device_map="auto", max_memory=max_memory
        ).eval()
        config, device_map = model.config, model.hf_device_map
    else:
        config = LlamaConfig(**{**LLAMA_8B, "num_hidden_layers": args.layers})
        model, device_map = dispatched_random_model(config, getattr(torch, args.dtype), max_memory=max_memory)
    devices = sorted({str(v) for v in device_map.values()})
    report = {
        "machine": machine_info("cuda"),
        "model": args.model or f"llama-3.1-8b shape, {args.layers} layers, random {args.dtype}",
        "dtype": args.dtype,
        "max_memory": args.max_memory,
        "gpus": torch.cuda.device_count(),
        "devices_used": devices,
        "device_map_sizes": {d: sum(1 for v in device_map.values() if str(v) == d) for d in devices},
        "build_s": time.time() - start,
        "cases": [],
    }
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    for ids, mask in prompts(config.vocab_size, pad_id, "cuda:0"):
        batch = ids.shape[0]
        for _ in range(2 if args.warm else 1):  # --warm: time the second call (plans, kernels, graphs built)
            t = time.time()
            plain = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False
            )
            torch.cuda.synchronize()
            plain_s = time.time() - t
        for strategy, settings in CASES:
            name = "utility" if settings else strategy
            if args.strategies and name not in args.strategies:
                continue
            extra = {"draft_model": model} if strategy == "draft_model" else {}
            for _ in range(2 if args.warm else 1):
                t = time.time()
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=args.new_tokens,
                    do_sample=False,
                    custom_generate=hsv.generate,
                    speculation=dict(
                        strategy=strategy, num_draft_tokens=4, **settings, **json.loads(args.speculation)
                    ),
                    return_dict_in_generate=True,
                    **extra,
                )
                torch.cuda.synchronize()
                seconds = time.time() - t
            same = out.sequences.shape == plain.shape and torch.equal(out.sequences, plain)
            report["cases"].append(
                {
                    "batch": batch,
                    "strategy": "draft_model (the target drafts for itself)"
                    if strategy == "draft_model"
                    else strategy + (", utility K policy" if settings else ""),
                    "graph_capture_s": out.speculation.graph_capture_s,
                    "identical_to_plain": bool(same),
                    "mean_acceptance_length": out.speculation.mean_acceptance_length,
                    "steps": out.speculation.steps,
                    "seconds": seconds,
                    "tokens_per_s": batch * args.new_tokens / seconds,
                    "plain_generate_tokens_per_s": batch * args.new_tokens / plain_s,
                    "plain_generate_seconds": plain_s,
                }
            )
            print(report["cases"][-1], flush=True)
    _records.save(args, report, "cuda" if torch.cuda.is_available() else "cpu")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
