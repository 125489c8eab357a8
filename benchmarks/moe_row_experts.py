"""How many distinct experts a verify row reaches on **trained** routing, against a uniform router: the quantity
that carries a ``row_union`` share graded on the ``code-moe`` fixture over to a larger MoE shape timed with random
weights (whose router is near uniform).

For each held-out prompt (``--model`` / ``--prompt-file`` for your own MoE checkpoint and text), the dense router of
every layer routes each token (full forward, CPU, float32); the tokens are cut into rows of ``--new-tokens``
consecutive positions (a verify step's row) and the experts each row routes to are counted. Recorded per layer and averaged: ``distinct`` (trained), ``uniform`` (the expectation when each of the
``q`` tokens draws its ``k`` of ``E`` experts uniformly: `hf_sparse_verify.drivers.shapes.expected_experts`), and the share of the row's
summed routing weight that its ``n`` heaviest experts hold (``mass_of_top``), which is what ``row_union`` keeps.

    python benchmarks/moe_row_experts.py --models ../shared/models --prompts 12 --new-tokens 7 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records  # noqa: E402


def row_counts(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, experts: int, row: int):
    """``(distinct [R], mass_sorted [R, E])`` of routing ``[T, k]`` cut into rows of ``row`` tokens (a tail shorter
    than a row is dropped): experts each row routes to, and each row's summed routing weight per expert, heaviest
    first, as a share of the row's total."""
    tokens = (top_k_index.shape[0] // row) * row
    index = top_k_index[:tokens].reshape(-1, row * top_k_index.shape[1])
    weight = top_k_weights[:tokens].float().reshape(index.shape)
    summed = torch.zeros(index.shape[0], experts).scatter_add_(1, index, weight)
    distinct = (summed > 0).sum(-1)
    mass = summed.sort(-1, descending=True).values
    return distinct, mass / mass.sum(-1, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="../shared/models", help="folder with code-moe and prompts.jsonl")
    parser.add_argument("--model", help="another MoE checkpoint folder (default: code-moe in --models)")
    parser.add_argument(
        "--prompt-file", help="jsonl of {len, text} windows (default: prompts.jsonl in --models)"
    )
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument(
        "--context", type=int, default=4096, help="held-out windows of this length (code-moe: 4K)"
    )
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[7, 8], help="tokens per verify row")
    _records.add_arguments(parser, "moe_routing", default_setting="code-moe-rows")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_sparse_verify.drivers.shapes import expected_experts
    from hf_sparse_verify.integrations.router import REPLACEABLE

    folder = Path(args.model or Path(args.models) / "code-moe")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    routers = [m for m in model.modules() if type(m).__name__ in REPLACEABLE]  # (logits, scores, ids) routers
    if not routers:
        raise SystemExit(f"no top-k router of {sorted(REPLACEABLE)} in {folder}")
    experts, k = routers[0].num_experts, routers[0].top_k
    routed: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def hook(layer):
        def keep(module, inputs, output):
            _, weights, index = output
            routed.setdefault(layer, []).append((index.detach(), weights.detach()))

        return keep

    handles = [router.register_forward_hook(hook(i)) for i, router in enumerate(routers)]
    prompt_file = Path(args.prompt_file or Path(args.models) / "prompts.jsonl")
    lines = [json.loads(x) for x in prompt_file.read_text().splitlines()]
    texts = [x["text"] for x in lines if x["len"] >= args.context][: args.prompts]
    if not texts:
        raise SystemExit(f"no window of {args.context} tokens in {prompt_file}")
    for text in tqdm(texts, desc="prompts"):
        ids = tokenizer(text, return_tensors="pt").input_ids[:, : args.context]
        with torch.no_grad():
            model(ids)
    for handle in handles:
        handle.remove()
    rows = {}
    for row in args.new_tokens:
        per_layer, mass = {}, []
        for layer, calls in sorted(routed.items()):
            counted = [row_counts(i, w, experts, row) for i, w in calls]
            distinct = torch.cat([d for d, _ in counted]).float()
            per_layer[layer] = round(distinct.mean().item(), 2)
            mass.append(torch.cat([m for _, m in counted]))
        mass_of_top = torch.cat(mass).cumsum(-1).mean(0)  # [E]: share held by the n heaviest, n = 1 .. E
        rows[str(row)] = dict(
            distinct=round(sum(per_layer.values()) / len(per_layer), 2),
            distinct_per_layer=per_layer,
            uniform=round(expected_experts(experts, k, row), 2),
            mass_of_top={str(n + 1): round(v, 4) for n, v in enumerate(mass_of_top.tolist())},
        )
        print(f"rows of {row}: distinct {rows[str(row)]['distinct']} (uniform {rows[str(row)]['uniform']})")
    model_name = "code-moe (trained, 8M Qwen3-MoE)" if args.model is None else str(folder)
    result = dict(
        model=model_name, experts=experts, top_k=k, context=args.context, prompts=len(texts), rows=rows
    )
    _records.save(args, result, "cpu")


if __name__ == "__main__":
    main()
