"""CPU check: a random-token prompt (nothing is accepted) with our K = 0, prompt lookup + utility, and auto; best
of two warm calls each, float32, one thread. Prints seconds and ratios to K = 0.

    OMP_NUM_THREADS=1 python lab/random_prompt_cpu.py --shared ../shared
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import hf_sparse_verify as hsv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", default="../shared")
    parser.add_argument("--length", type=int, default=800)
    parser.add_argument("--new-tokens", type=int, default=120)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = Path(args.shared) / "models"
    target = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "code-draft", dtype=torch.float32).eval()
    vocab = target.config.vocab_size
    ids = torch.randint(3, vocab, (1, args.length), generator=torch.Generator().manual_seed(0))
    cases = {
        "k0": dict(strategy="prompt_lookup", k_policy="plain"),
        "prompt_lookup:utility": dict(strategy="prompt_lookup", k_policy="utility"),
        "draft_model:utility": dict(strategy="draft_model", k_policy="utility"),
        "auto": dict(strategy="auto"),
    }
    seconds = {}
    for name, spec in cases.items():
        best = None
        for _ in range(3):  # a warm-up, then the best of two
            start = time.perf_counter()
            out = target.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                do_sample=False, custom_generate=hsv.generate, speculation=spec,
                draft_model=draft if name != "k0" and "prompt_lookup" not in name else None,
                return_dict_in_generate=True,
            )  # fmt: skip
            took = time.perf_counter() - start
            best = took if best is None else min(best, took)
        seconds[name] = best
        chosen = out.speculation.chosen
        print(json.dumps({"case": name, "seconds": round(best, 3), "vs_k0": round(seconds["k0"] / best, 3),
                          "chosen": chosen}))  # fmt: skip


if __name__ == "__main__":
    main()
