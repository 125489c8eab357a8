"""Why greedy agreement of LOSSY sparse verification falls at 16K on the fixture: the dense model's top-2 margins.

Position-wise agreement over 256 free-running tokens ends at the first flipped argmax. This diagnostic measures,
on the prompts `bench_sparse_quality.py` uses (same trimming), how close the dense model's own greedy decisions
are: per new-token position the margin between its two best logits (teacher-forced over the dense continuation),
and for one sparse setting the first divergence and the dense margin there.

    python benchmarks/diag_sparse_margins.py --models ../shared/models --out benchmarks/results/sparse_verify_margins.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from tqdm import tqdm

from benchmarks.bench_sparse_quality import DEFAULT, _generate, _load, _prompts
from hf_sparse_verify.drivers.machine import machine_info

THRESHOLDS = (0.02, 0.05, 0.1, 0.25)


@torch.no_grad()
def margins(model, ids: torch.Tensor, continuation: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit of the dense model at each continuation position (teacher-forced)."""
    full = torch.cat([ids, continuation])[None].to(model.device)
    logits = model(full, logits_to_keep=continuation.numel() + 1).logits[0, :-1].float()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True)
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tok = _load(os.path.join(args.models, "code-target"), device, torch.float32)
    base = dict(strategy="prompt_lookup", num_draft_tokens=args.k)
    sparse = dict(base, lossy_sparse_verify=DEFAULT.to_dict())
    records = []
    for context in args.contexts:
        keep = context - args.new_tokens - args.k - 1
        prompts = [ids[-keep:] for ids in _prompts(os.path.join(args.models, "prompts_long.jsonl"), context,
                                                   args.prompts, tok)]  # fmt: skip
        for p, ids in enumerate(tqdm(prompts, desc=f"context {context}", file=sys.stderr)):
            dense_out = _generate(model, ids, args.new_tokens, base)[0]
            sparse_out = _generate(model, ids, args.new_tokens, sparse)[0]
            m = margins(model, ids, dense_out)
            n = min(dense_out.numel(), sparse_out.numel())
            differ = (dense_out[:n] != sparse_out[:n]).nonzero()
            first = int(differ[0]) if len(differ) else None
            records.append(dict(
                context=context, prompt=p, new_tokens=int(dense_out.numel()), setting="default",
                median_margin=round(float(m.median()), 4),
                **{f"share_margin_below_{t}": round(float((m < t).float().mean()), 4) for t in THRESHOLDS},
                first_divergence=first, margin_at_divergence=None if first is None else round(float(m[first]), 4),
            ))  # fmt: skip
            print(json.dumps(records[-1]), flush=True)
    summary = {
        context: {
            "median_margin": statistics.median(
                r["median_margin"] for r in records if r["context"] == context
            ),
            "margins_at_divergence": [r["margin_at_divergence"] for r in records if r["context"] == context],
        }
        for context in args.contexts
    }
    result = dict(machine=machine_info(device), method=__doc__.strip().splitlines()[0], records=records,
                  summary=summary)  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
