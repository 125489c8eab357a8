"""`benchmarks/project_gated_delta_bytes.py`: a Gated DeltaNet hybrid's verify-step bytes by part (a projection)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3NextConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, holding the benchmarks package
from benchmarks.project_gated_delta_bytes import project, weight_bytes  # noqa: E402


def _config() -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
    )  # fmt: skip


def test_parts_cover_every_weight_and_the_step_adds_up():
    config = _config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    parts = weight_bytes(model)
    assert sum(parts.values()) == sum(p.numel() * 2 for p in model.parameters())
    assert parts["experts"] > 0 and parts["linear_attn"] > 0
    one = project(config, parts, batch=1, context=64, k=0)
    assert one["distinct_experts_per_layer"] == pytest.approx(2.0)  # one token reaches its top-k
    assert one["token_by_token_over_window"] == 1.0  # a one-token step reads the layer once either way
    four = project(config, parts, batch=2, context=64, k=4)
    state = 4 * 8 * 8 * 4  # float32 [value heads, key dim, value dim] per layer and row
    assert four["state_bytes"] == 2 * 5 * 3 * state * 2  # rows x tokens x linear layers x (read + write)
    assert four["state_bytes_on_chip"] == 2 * 3 * state * 6  # one read, every token's state written
    assert four["kv_bytes"] == 2 * 64 * 1 * 2 * 8 * 2 * 2
    assert four["step_bytes"] == four["weight_bytes"] + four["kv_bytes"] + four["state_bytes"]
    assert four["token_by_token_extra_bytes"] == 4 * parts["linear_attn"]
    assert 2.0 < four["distinct_experts_per_layer"] < 8.0
