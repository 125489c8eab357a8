"""Self-speculation (Vegas) on a long prompt: the target drafts for itself, attending to a few cached tokens.

No draft model: each draft step of the target reads only ``max(min_tokens, ratio * prefix)`` cached tokens per
layer, chosen by the attention scores its own verify step computed. The verify step reads everything, so greedy
output still equals plain generate. The pay-off grows with the prompt (long documents, long chats) on a GPU;
on a CPU with the tiny demo model this only shows the mechanics.

    python examples/03_vegas_long_prompt.py [--model DIR_OR_ID] [--prompt-tokens N] [--max-new-tokens N]
"""

from __future__ import annotations

import argparse
import inspect
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(hsv.default_model_path(), "target"))
    parser.add_argument(
        "--prompt-tokens", type=int, default=2048, help="keep the first N tokens of the document"
    )
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    # a long Python document (this package's config module), cut after its first N tokens
    document = inspect.getsource(hsv.config)
    input_ids = tokenizer(document, truncation=True, max_length=args.prompt_tokens, return_tensors="pt")[
        "input_ids"
    ]

    speculation = hsv.SpeculationConfig(
        strategy="vegas",
        num_draft_tokens=4,
        ratio=0.05,  # the draft attends to 5% of the prefix ...
        min_tokens=64,  # ... but to at least 64 tokens (the paper's defaults: 0.07 and 256)
    )
    out = model.generate(
        input_ids=input_ids,
        custom_generate=hsv.generate,
        speculation=speculation,
        max_new_tokens=args.max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    print(tokenizer.decode(out.sequences[0, input_ids.shape[1] :], skip_special_tokens=True))
    budget = max(speculation.min_tokens, int(speculation.ratio * input_ids.shape[1]))
    print(f"prompt: {input_ids.shape[1]} tokens; draft steps attend to about {budget} of them per layer")
    print(out.speculation.summary())

    plain = model.generate(input_ids=input_ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    assert torch.equal(out.sequences, plain), "greedy speculative decoding must reproduce plain generate"
    print("identical to plain generate: True")


if __name__ == "__main__":
    main()
