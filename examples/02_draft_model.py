"""A small draft model proposes tokens for a batch of prompts; the target verifies them.

The draft must share the target's tokenizer. Pass it as ``draft_model=`` or as transformers' own
``assistant_model=``. ``strategy="draft_model"`` drafts with it at every step; with the default ``strategy="auto"``
it is one of the drafters the planner chooses from, step by step.

    python examples/02_draft_model.py [--model DIR_OR_ID --draft-model DIR_OR_ID] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv

PROMPTS = [
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument("--draft-model", default=os.path.join(hsv.default_model_path(), "draft"))
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")  # batches are left-padded
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    target = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft_model, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)

    out = target.generate(
        **inputs,
        custom_generate=hsv.generate,
        assistant_model=draft,  # or draft_model=draft
        speculation={"strategy": "draft_model", "num_draft_tokens": 4},  # a dict works as well as a SpeculationConfig
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    prompt_len = inputs["input_ids"].shape[1]
    for text in tokenizer.batch_decode(out.sequences[:, prompt_len:], skip_special_tokens=True):
        print("-" * 40 + "\n" + text)
    stats = out.speculation
    print(f"strategy={stats.strategy} mean acceptance length={stats.mean_acceptance_length:.2f}")

    plain = target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
    assert torch.equal(out.sequences, plain), "greedy speculative decoding must reproduce plain generate"
    print("identical to plain generate: True")


if __name__ == "__main__":
    main()
