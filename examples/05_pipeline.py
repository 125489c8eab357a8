"""Speculative decoding through a transformers ``pipeline``: pass the same arguments as to ``generate``.

python examples/05_pipeline.py [--model DIR_OR_ID --draft-model DIR_OR_ID] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

import hf_sparse_verify as hsv

PROMPTS = ["def fibonacci(n):\n", "import json\n\n\ndef load(path):\n", "for i in range(10):\n"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument("--draft-model", default=os.path.join(hsv.default_model_path(), "draft"))
    parser.add_argument("--max-new-tokens", type=int, default=24)
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)

    settings = dict(max_new_tokens=args.max_new_tokens, do_sample=False, return_full_text=False, batch_size=3)
    results = pipe(
        PROMPTS,
        custom_generate=hsv.generate,
        speculation={"strategy": "draft_model", "num_draft_tokens": 4},
        draft_model=draft,
        **settings,
    )
    for prompt, result in zip(PROMPTS, results):
        print("-" * 40 + "\n" + prompt + result[0]["generated_text"])

    assert results == pipe(PROMPTS, **settings), "greedy speculative decoding must reproduce plain generate"
    print("identical to the plain pipeline: True")


if __name__ == "__main__":
    main()
