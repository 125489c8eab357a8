"""Device check: float32 greedy output of our dense (lossless) path equals plain `generate` on the 16K-trained
fixture at 8K and 16K context (prompt_lookup, K = 6), and what sparse verification's default gives beside it.

    python benchmarks/device/check_long_equality.py .carry/shared/models
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv

models = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(f"{models}/code-target", dtype=torch.float32).cuda().eval()
tok = AutoTokenizer.from_pretrained(f"{models}/code-target")
rows = [json.loads(line) for line in open(f"{models}/prompts_long.jsonl")]
for context in (8192, 16384):
    for text in [r["text"] for r in rows if r["len"] == context][:2]:
        ids = tok(text, return_tensors="pt")["input_ids"][:, -(context - 64 - 7) :].cuda()
        plain = model.generate(input_ids=ids, max_new_tokens=64, do_sample=False)
        for name, extra in (("dense", {}), ("sparse_default", {"lossy_sparse_verify": {}})):
            ours = model.generate(
                input_ids=ids, max_new_tokens=64, do_sample=False, custom_generate=hsv.generate,
                speculation=dict(strategy="prompt_lookup", num_draft_tokens=6, **extra),
            )  # fmt: skip
            n = min(ours.shape[1], plain.shape[1])
            diff = (ours[0, :n] != plain[0, :n]).nonzero()
            first = int(diff[0]) - ids.shape[1] if len(diff) else None
            print(
                json.dumps(
                    dict(
                        context=context, prompt=ids.shape[1], path=name, equal=first is None, first_diff=first
                    )
                )
            )
