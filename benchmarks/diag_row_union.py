"""How many distinct experts a verify step of ``q`` tokens reads per MoE layer under each expert-skipping setting,
with a random router of the Qwen3-30B-A3B shape (128 experts, top 8, hidden 2048, router weights N(0, 0.02) as
transformers initialises them, unit-RMS inputs; weights renormalised over the top 8 as Qwen3 does). This is the
routing `bench_sparse_verify.py` times on random weights; a trained router correlates neighbouring tokens more.

    python benchmarks/diag_row_union.py --trials 200 --json benchmarks/results/diag_row_union.json
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_sparse_verify.sparse.moe import order_by_weight, row_union, skip_counts
from hf_sparse_verify.step.slots import MoESkip

SETTINGS = {  # as in bench_sparse_verify.py
    "moe_skip4": MoESkip("budget", 4, torch.tensor(0.3)),
    "moe_skip6": MoESkip("budget", 6, torch.tensor(0.1)),
    "moe_row8": MoESkip("row_union", 7, torch.tensor(8.0)),
    "moe_row8_keep2": MoESkip("row_union", 6, torch.tensor(8.0)),
    "moe_row16": MoESkip("row_union", 7, torch.tensor(16.0)),
}


def kept(index: torch.Tensor, n_active: torch.Tensor) -> tuple[int, int]:
    """(distinct experts read, (token, expert) pairs computed) of one step."""
    pairs = [e for t in range(index.shape[0]) for e in index[t, : int(n_active[t])].tolist()]
    return len(set(pairs)), len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--json")
    args = parser.parse_args()
    experts, k, hidden = 128, 8, 2048
    gen = torch.Generator().manual_seed(0)
    records = []
    for q in args.tokens:
        sums: dict[str, list[int]] = {}
        for _ in range(args.trials):
            x = torch.randn(q, hidden, generator=gen)
            router = torch.randn(experts, hidden, generator=gen) * 0.02
            weights, index = torch.softmax(x @ router.T, dim=-1).topk(k)
            weights = weights / weights.sum(-1, keepdim=True)
            dense = kept(index, torch.full((q,), k))
            sums.setdefault("dense", [0, 0])
            sums["dense"] = [a + b for a, b in zip(sums["dense"], dense)]
            for name, skip in SETTINGS.items():
                if skip.rule == "row_union":
                    out_index, _, n_active = row_union(index, weights, skip, q)
                else:
                    out_index, _ = order_by_weight(index, weights)
                    n_active = skip_counts(weights, skip)
                sums[name] = [a + b for a, b in zip(sums.get(name, [0, 0]), kept(out_index, n_active))]
        for name, (distinct, pairs) in sums.items():
            records.append(
                dict(
                    tokens=q, setting=name, distinct_experts=distinct / args.trials, pairs=pairs / args.trials
                )
            )
            print(json.dumps(records[-1]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(method=__doc__.split("\n\n")[0], trials=args.trials, records=records), f, indent=1)


if __name__ == "__main__":
    main()
