"""GPT-NeoX-Japanese's attention runs its own ``baddbmm`` / softmax; `integrations.gpt_neox_japanese` replaces it for
the call with one that dispatches through `AttentionInterface`. Greedy output equals plain ``generate`` token for
token (float32, a left-padded batch of 2) for every lossless strategy, also on the Triton backend; the originals are
back after the call."""

from __future__ import annotations

import pytest
import torch
from conftest import equal_plain, sharpen, strategy_equals_plain
from transformers import GPTNeoXJapaneseConfig, GPTNeoXJapaneseForCausalLM

from hf_sparse_verify.integrations import GPTNeoXJapaneseAttentionDispatch, speculation_mode


def _model() -> torch.nn.Module:
    # GPTNeoXJapaneseModelTester's sizes (vocabulary 99, hidden 32, 4 heads), partial rotary, two layers (the last
    # one's attention carries the dense bias)
    config = GPTNeoXJapaneseConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_multiple_size=4,
        max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.5},
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPTNeoXJapaneseForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.gpt_neox_japanese.layers:
            if layer.attention.dense_bias is not None:
                layer.attention.dense_bias.normal_()  # initialized to zeros: make the bias count
    sharpen(model, 3.0, ("embed",))  # peaked outputs: drafts are accepted and rejected
    return model


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "vegas", "auto"])
def test_gpt_neox_japanese_equals_plain(strategy):
    model = _model()
    strategy_equals_plain(model, strategy)


def test_gpt_neox_japanese_equals_plain_on_the_triton_backend():
    speculation = {"strategy": "prompt_lookup", "num_draft_tokens": 4, "attention_backend": "triton",
                   "cuda_graphs": False}  # fmt: skip
    equal_plain(_model(), speculation)


def test_replacements_run_and_are_undone():
    model = _model()
    layers = model.gpt_neox_japanese.layers
    originals = [layer.attention for layer in layers]
    with speculation_mode(model) as switched:
        assert all(isinstance(layer.attention, GPTNeoXJapaneseAttentionDispatch) for layer in layers)
        assert switched.counts and layers[0].attention.query_key_value is originals[0].query_key_value
        assert layers[-1].attention.dense_bias is originals[-1].dense_bias is not None
    assert [layer.attention for layer in layers] == originals
