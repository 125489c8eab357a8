"""How much a verify step's per-token top-k selections overlap on **trained** weights: the quantity DSA's merged
schedule reads (`hf_sparse_verify.kernels.sparse_mla`), measured with an oracle indexer on the trained fixture
(``code-target``, held-out 16K prompts), since no trained DSA model fits this machine.

For each layer, each of the last ``--new-tokens`` query positions of a prompt selects the ``top-k`` keys with the
largest attention probability averaged over its heads (one selection per token shared by the heads, as DSA's
indexer makes; ``top-k = context / 8``, DSA's 2048 of 16K); recorded is the union of those selections over one
selection (``union_over_topk``, per layer and averaged): the rows a merged verify reads over the rows one decode step
reads. CPU, float32.

    python benchmarks/dsa_selection_overlap.py --models ../shared/models --prompts 2
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="../shared/models")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--context", type=int, default=16384)
    parser.add_argument("--new-tokens", type=int, default=8)
    _records.add_arguments(parser, "dsa", default_setting="oracle-overlap-code-target")
    args = parser.parse_args()
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    folder = Path(args.models) / "code-target"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    new = args.new_tokens

    def capture(module, query, key, value, attention_mask, **kwargs):
        captured[module.layer_idx] = (query[:, :, -new:].clone(), key.clone(), kwargs.get("scaling"))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("capture_topk", capture)
    model.set_attn_implementation("capture_topk")
    lines = [json.loads(x) for x in (Path(args.models) / "prompts_long.jsonl").read_text().splitlines()]
    texts = [x["text"] for x in lines if x["len"] >= args.context][: args.prompts]
    top_k = args.context // 8
    per_layer: dict[int, list[float]] = {}
    for text in tqdm(texts, desc="prompts"):
        ids = tokenizer(text, return_tensors="pt").input_ids[:, : args.context]
        captured.clear()
        with torch.no_grad():
            model(ids)
        for layer, (query, key, scaling) in captured.items():
            groups = query.shape[1] // key.shape[1]
            key = key.repeat_interleave(groups, dim=1)
            length = key.shape[2]
            logits = torch.einsum("bhqd,bhkd->bhqk", query, key) * (scaling or query.shape[-1] ** -0.5)
            positions = torch.arange(length)
            causal = positions[None, :] <= (length - new + torch.arange(new))[:, None]
            probs = logits.masked_fill(~causal, float("-inf")).softmax(-1).mean(1)  # [B, q, L]
            chosen = probs.topk(top_k, dim=-1).indices  # [B, q, k]
            union = torch.zeros(length, dtype=torch.bool)
            union[chosen[0].flatten()] = True
            per_layer.setdefault(layer, []).append(union.sum().item() / top_k)
    layers = {k: round(sum(v) / len(v), 3) for k, v in sorted(per_layer.items())}
    result = dict(
        model="code-target (trained, 15.7M Llama)", selection="oracle: top-k of head-averaged attention",
        context=args.context, new_tokens=new, top_k=top_k, prompts=len(texts),
        union_over_topk_per_layer=layers, union_over_topk=round(sum(layers.values()) / len(layers), 3),
    )  # fmt: skip
    print(result)
    _records.save(args, result, "cpu")


if __name__ == "__main__":
    main()
