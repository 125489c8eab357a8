"""Where does the time of one generate call go? Host profile (cProfile) of a call per configuration, with wall
time vs the sum of the measured step times (draft + verify). Diagnostic, not a benchmark.

    python benchmarks/diag_step_overhead.py --shared ../shared
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    shared = Path(args.shared) / "models"
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(shared / "code-target", dtype=dtype).to(args.device).eval()
    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    text = next(
        json.loads(line)["text"] for line in open(shared / "prompts.jsonl") if json.loads(line)["len"] == 1024
    )
    ids = tok(text, return_tensors="pt").input_ids[:, :1024].to(args.device)
    configs = {
        "static_k3": dict(strategy="prompt_lookup", num_draft_tokens=3),
        "utility": dict(strategy="prompt_lookup", k_policy="utility", max_draft_tokens=8),
    }
    from torch.nn.attention import SDPBackend, sdpa_kernel

    variants = {
        "default": None,
        "no_cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "efficient_only": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    }
    for variant, backends in variants.items():
        print(f"######## SDPA backends: {variant}")
        if backends is None:
            run_configs(model, ids, configs, args)
        else:
            with sdpa_kernel(backends):
                run_configs(model, ids, configs, args)


def run_configs(model, ids, configs, args) -> None:
    for name, spec in configs.items():
        for _ in range(2):
            model.generate(
                ids,
                max_new_tokens=args.new_tokens,
                do_sample=False,
                custom_generate=hsv.generate,
                speculation=spec,
            )
        profiler = cProfile.Profile()
        torch.cuda.synchronize() if args.device != "cpu" else None
        start = time.perf_counter()
        profiler.enable()
        out = model.generate(
            ids,
            max_new_tokens=args.new_tokens,
            do_sample=False,
            custom_generate=hsv.generate,
            speculation=spec,
            return_dict_in_generate=True,
        )
        profiler.disable()
        torch.cuda.synchronize() if args.device != "cpu" else None
        wall = time.perf_counter() - start
        st = out.speculation
        print(
            f"== {name}: wall {wall:.3f}s steps {st.steps} sum(step times) {sum(st.step_times_s):.3f}s "
            f"draft {st.draft_time_s:.3f} verify {st.verify_time_s:.3f} prefill {st.prefill_time_s:.3f}"
        )
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(3)
        print("\n".join(buf.getvalue().splitlines()[6:10]))


if __name__ == "__main__":
    main()
