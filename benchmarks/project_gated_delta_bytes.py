"""Bytes a verify step of a Gated DeltaNet hybrid reads and writes, by part: a PROJECTION from the model's shapes
(no GPU, no timing), for issue 41's "state keeping <= 10% of the verify step (state bytes against the step's bytes)".

The model is built on the meta device from its transformers config (default: `Qwen3NextConfig()`, the shapes of
Qwen3-Next-80B-A3B), bf16 weights. Per (batch, context, K) step of ``K + 1`` tokens per row:

- weights: every non-expert weight once (the input embedding's gathered rows are left out; the LM head is read),
  plus the routed experts the step's tokens reach, expected over uniform routing: ``E (1 - (1 - k / E)^(B (K + 1)))``
  distinct experts per layer;
- KV cache: the full-attention layers' keys and values of ``context`` tokens per row, bf16;
- recurrent state: each Gated DeltaNet layer's float32 state, read and written once per token (the recurrence of
  `GatedDeltaWindow`, which keeps every token's state for rollback), and, for comparison, read once and written per
  token (a kernel that keeps the state on chip over the window);
- `TokenByToken` instead reads the Gated DeltaNet layers' own weights ``K + 1`` times: ``token_by_token_extra``.

    python benchmarks/project_gated_delta_bytes.py --cases 1x16384 4x16384 8x32768 --ks 0 4

Writes ``results/gated_delta_bytes.json`` (record ``qwen3_next``, or ``--setting``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _records  # noqa: E402


def weight_bytes(model: torch.nn.Module) -> dict[str, float]:
    """Parameter bytes by part: ``experts`` (routed), ``linear_attn`` (Gated DeltaNet), ``embedding``, ``lm_head``
    and ``rest`` (attention, shared experts, routers, norms)."""
    parts = dict(experts=0.0, linear_attn=0.0, embedding=0.0, lm_head=0.0, rest=0.0)
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        if ".experts." in name:
            parts["experts"] += size
        elif "linear_attn" in name:
            parts["linear_attn"] += size
        elif "embed_tokens" in name:
            parts["embedding"] += size
        elif "lm_head" in name:
            parts["lm_head"] += size
        else:
            parts["rest"] += size
    return parts


def project(config, parts: dict[str, float], batch: int, context: int, k: int) -> dict:
    """One step's bytes by part (see the module docstring)."""
    layers, experts, top = config.num_hidden_layers, config.num_experts, config.num_experts_per_tok
    linear = sum(t == "linear_attention" for t in config.layer_types)
    full = layers - linear
    tokens = k + 1
    distinct = experts * (1 - (1 - top / experts) ** (batch * tokens))
    weights = parts["rest"] + parts["linear_attn"] + parts["lm_head"] + parts["experts"] * distinct / experts
    kv = batch * context * full * config.num_key_value_heads * config.head_dim * 2 * 2
    state = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    per_token = batch * tokens * linear * state * 2
    on_chip = batch * linear * state * (1 + tokens)
    step = weights + kv + per_token
    return dict(
        batch=batch, context=context, k=k, distinct_experts_per_layer=distinct, weight_bytes=weights, kv_bytes=kv,
        state_bytes=per_token, state_share=per_token / step, state_bytes_on_chip=on_chip,
        state_share_on_chip=on_chip / (weights + kv + on_chip), step_bytes=step,
        token_by_token_extra_bytes=parts["linear_attn"] * k,
        token_by_token_over_window=(step + parts["linear_attn"] * k) / step,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["1x16384", "4x16384", "8x32768"], help="BxL")
    parser.add_argument("--ks", nargs="+", type=int, default=[0, 4])
    _records.add_arguments(parser, "gated_delta_bytes", default_setting="qwen3_next")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    config = Qwen3NextConfig()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    parts = weight_bytes(model)
    rows = []
    for case in args.cases:
        batch, context = (int(x) for x in case.split("x"))
        for k in args.ks:
            rows.append(project(config, parts, batch, context, k))
            r = rows[-1]
            print(f"{case} K={k}: step {r['step_bytes'] / 1e9:.2f} GB, state {r['state_bytes'] / 1e9:.3f} GB "
                  f"({100 * r['state_share']:.1f}%), TokenByToken reads {r['token_by_token_over_window']:.2f}x")  # fmt: skip
    result = dict(model="Qwen3-Next-80B-A3B shapes (Qwen3NextConfig defaults), meta device, bf16 weights",
                  kind="projection (bytes), not a measurement", weight_parts=parts, rows=rows)  # fmt: skip
    _records.save(args, json.loads(json.dumps(result)), "cpu")


if __name__ == "__main__":
    main()
