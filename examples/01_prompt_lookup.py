"""Greedy speculative decoding with prompt lookup: no draft model, the same tokens as plain generate.

Prompt lookup drafts by copying n-grams from the prompt and the output so far, so it pays off when the output
repeats its input (code edits, summaries, retrieval-augmented answers).

    python examples/01_prompt_lookup.py [--model DIR_OR_ID] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv

PROMPT = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


def volume(width, height, depth):
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")

    out = model.generate(
        **inputs,
        custom_generate=hsv.generate,
        speculation=hsv.SpeculationConfig(strategy="prompt_lookup", num_draft_tokens=4),
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    print(tokenizer.decode(out.sequences[0], skip_special_tokens=True))
    print(out.speculation.summary())

    plain = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    assert torch.equal(out.sequences, plain), "greedy speculative decoding must reproduce plain generate"
    print("identical to plain generate: True")


if __name__ == "__main__":
    main()
