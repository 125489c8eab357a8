"""Decode attention with the split-KV merge in its own launch (`_merge_kernel`) against the merge folded into the
split kernel (`kernel.FUSED_MERGE`), side by side in one process.

Kernel cases (random bf16 caches, rows ending at the context, default splits), each timed as CUDA-graph replays
(``bench_kernels.time_case``), alternating the two paths for ``--rounds`` rounds: Qwen3-30B-A3B heads (32 / 4 / 128)
at 1 x 1K with 1 and 8 new tokens, Llama-3.1-8B heads (32 / 8 / 128) at 1 x 16K, 4 x 64K, 16 x 16K with 1 and 7; the
verify widths also with Vegas' two-row softmax-weight scores. With ``--step-shape`` it then times whole decode /
verify steps (`hf_sparse_verify.bench.step.run_on`) on one random-weight model, again alternating the paths.

``python benchmarks/bench_decode_attention_merge.py --json out.json [--step-shape qwen3-30b-a3b]``
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch

from benchmarks.bench_kernels import time_case
from hf_sparse_verify.bench.machine import machine_info
from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.decode_attention import kernel as attn_kernel
from hf_sparse_verify.kernels.decode_attention.op import default_splits

DIM = 128
#: (name, query heads, KV heads, batch, context, new tokens)
CASES = (
    ("qwen3-30b-a3b", 32, 4, 1, 1024, (1, 8)),
    ("llama-3.1-8b", 32, 8, 1, 16384, (1, 7)),
    ("llama-3.1-8b", 32, 8, 4, 65536, (1, 7)),
    ("llama-3.1-8b", 32, 8, 16, 16384, (1, 7)),
)
#: kernel settings of each path timed
PATHS = {
    "two_launch": dict(FUSED_MERGE=False),
    "fused_merge": dict(FUSED_MERGE=True, MERGE_UNROLL=4),
    "fused_merge_unroll1": dict(FUSED_MERGE=True, MERGE_UNROLL=1),
}
#: paths of the whole-step timing
STEP_PATHS = ("two_launch", "fused_merge")


def _set(path: str) -> None:
    for name, value in PATHS[path].items():
        setattr(attn_kernel, name, value)


def _call(args, path: str, scores: bool):
    _set(path)
    if scores:
        return decode_attention(*args, collect="two_rows", weights=True)
    return decode_attention(*args)


def _save(result: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


@torch.no_grad()
def kernel_cases(result: dict, rounds: int, json_path: str | None) -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    for name, heads, kv_heads, batch, context, widths in CASES:
        gen = torch.Generator().manual_seed(context + batch)
        key = torch.randn(batch, kv_heads, context, DIM, generator=gen).to(device, dtype)
        value = torch.randn(batch, kv_heads, context, DIM, generator=gen).to(device, dtype)
        for q_len in widths:
            query = torch.randn(batch, heads, q_len, DIM, generator=gen).to(device, dtype)
            start = torch.full((batch,), context - q_len, device=device)
            pad = torch.zeros(batch, dtype=torch.long, device=device)
            args = (query, key, value, start, pad, DIM**-0.5)
            for scores in (False, True) if q_len > 1 else (False,):
                outs = {p: _call(args, p, scores) for p in PATHS}
                diff = max(
                    (outs["two_launch"][0].float() - o[0].float()).abs().max().item() for o in outs.values()
                )
                times: dict[str, list[float]] = {p: [] for p in PATHS}
                for _ in range(rounds):
                    for p in PATHS:
                        seconds, how = time_case(functools.partial(_call, args, p, scores), device, False)
                        times[p].append(round(seconds * 1e6, 2))
                best = {p: min(t) for p, t in times.items()}
                record = dict(
                    shape=name, heads=heads, kv_heads=kv_heads, batch=batch, context=context, q_len=q_len,
                    vegas_scores=scores, splits=default_splits(batch, kv_heads, context), timing=how,
                    us_per_layer=times, best_us=best, fused_over_two_launch=round(best["fused_merge"] / best["two_launch"], 3),
                    saved_us=round(best["two_launch"] - best["fused_merge"], 2), max_abs_out_diff=diff,
                )  # fmt: skip
                print(json.dumps(record), flush=True)
                result["kernel"].append(record)
                _save(result, json_path)
            del query
        del key, value
        torch.cuda.empty_cache()


def step_cases(result: dict, shape: str, context: int, widths, rounds: int, json_path: str | None) -> None:
    from hf_sparse_verify.bench.shapes import random_model
    from hf_sparse_verify.bench.step import StepBenchArgs, run_on

    device = torch.device("cuda")
    begin = time.perf_counter()
    model = random_model(shape, device, torch.bfloat16)
    result["step_model_build_s"] = round(time.perf_counter() - begin, 1)
    args = StepBenchArgs(
        shape=shape, contexts=(context,), new_tokens=tuple(widths), transformers=False, repeats=20
    )
    for r in range(rounds):
        for p in STEP_PATHS:
            _set(p)
            out = run_on(model, args, device)
            for rec in out["records"]:
                row = dict(round=r, path=p, **{k: rec[k] for k in ("context", "new_tokens", "batch", "ours_ms",
                                                                    "ours_mode", "floor_ms", "ours_over_floor")})  # fmt: skip
                print(json.dumps(row), flush=True)
                result["step"].append(row)
            _save(result, json_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the paths per case")
    parser.add_argument("--step-shape", help="also time whole steps of this shape (e.g. qwen3-30b-a3b)")
    parser.add_argument("--step-context", type=int, default=1024)
    parser.add_argument("--step-new-tokens", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--skip-kernels", action="store_true")
    args = parser.parse_args()
    default = {name: getattr(attn_kernel, name) for settings in PATHS.values() for name in settings}
    result = dict(machine=machine_info(torch.device("cuda")), kernel=[], step=[])
    try:
        if not args.skip_kernels:
            kernel_cases(result, args.rounds, args.json)
        if args.step_shape:
            step_cases(
                result, args.step_shape, args.step_context, args.step_new_tokens, args.rounds, args.json
            )
    finally:
        for name, value in default.items():
            setattr(attn_kernel, name, value)
        _save(result, args.json)


if __name__ == "__main__":
    main()
