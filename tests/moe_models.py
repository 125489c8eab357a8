"""Tiny random MoE models shared by the MoE tests (the four experts classes transformers routes through its experts
interface), and the Triton-interpreter skip mark."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, VOCAB, make_model
from transformers import AutoModelForCausalLM, Qwen2MoeConfig

from hf_sparse_verify.kernels._triton import triton_runs_on

MOE_ARCHS = ["qwen3_moe", "mixtral", "olmoe", "qwen2_moe"]
needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)


def make_moe(arch: str, seed: int = 0) -> torch.nn.Module:
    """A tiny float32 random MoE model; Qwen2-MoE (shared expert, not in conftest's list) built alike here."""
    if arch in ARCHITECTURES:
        return make_model(arch, seed)
    config = Qwen2MoeConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "norm" not in name:
                p.mul_(4.0)
    return model.eval()
