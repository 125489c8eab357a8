"""XGLM's attention runs its own ``bmm`` / softmax; `integrations.xglm` replaces its self-attention modules for the
call with ones that dispatch through `AttentionInterface`. Greedy output equals plain ``generate`` token for token
(float32, a left-padded batch of 2) for every lossless strategy, also on the Triton backend; the originals are back
after the call."""

from __future__ import annotations

import pytest
import torch
from conftest import equal_plain, sharpen, strategy_equals_plain
from transformers import XGLMConfig, XGLMForCausalLM

from hf_sparse_verify.integrations import XGLMAttentionDispatch, speculation_mode


def _xglm() -> torch.nn.Module:
    # XGLMModelTester's sizes (vocabulary 99, d_model 32, 4 heads), two layers
    config = XGLMConfig(vocab_size=99, d_model=32, num_layers=2, attention_heads=4, ffn_dim=37, max_position_embeddings=512,
                        pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
    torch.manual_seed(0)
    model = XGLMForCausalLM(config).eval()
    sharpen(model, 3.0, ("embed",))  # peaked outputs: drafts are accepted and rejected
    return model


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "vegas", "auto"])
def test_xglm_equals_plain(strategy):
    model = _xglm()
    strategy_equals_plain(model, strategy)


def test_xglm_equals_plain_on_the_triton_backend():
    model = _xglm()
    speculation = {"strategy": "prompt_lookup", "num_draft_tokens": 4, "attention_backend": "triton",
                   "cuda_graphs": False}  # fmt: skip
    equal_plain(model, speculation)


def test_replacements_run_and_are_undone():
    model = _xglm()
    originals = [layer.self_attn for layer in model.model.layers]
    with speculation_mode(model) as switched:
        assert all(isinstance(layer.self_attn, XGLMAttentionDispatch) for layer in model.model.layers)
        assert switched.counts and model.model.layers[0].self_attn.q_proj is originals[0].q_proj
    assert [layer.self_attn for layer in model.model.layers] == originals
