"""Models whose last layers read an earlier layer's keys and values (Gemma 3n, Gemma 4: ``num_kv_shared_layers``,
transformers' ``dummy`` cache layers), built from transformers' own model-tester settings (four layers, the last two
sharing, both attention kinds shared; Gemma 4 with its MoE blocks on). A shared layer's cache entry is its source
layer's (`SpecCache(shared_layers=...)`), and Gemma 4's prefill keeps every position through the shared layers
(`_compat.last_logit`). Greedy output equals plain ``generate`` (float32, a ragged batch) with drafts rejected
part-way, for every lossless strategy."""

from __future__ import annotations

import pytest
import torch
from conftest import equal_plain, noisy_copy, sharpen, strategy_equals_plain
from transformers import AutoModelForCausalLM, Gemma3nTextConfig, Gemma4TextConfig

from hf_sparse_verify._compat import architecture_refusal, kv_shared_sources, last_logit
from hf_sparse_verify.attention.cache import SpecCache


def _shared(kind: str, seed: int = 0) -> torch.nn.Module:
    if kind == "gemma4":  # Gemma4TextModelTester
        config = Gemma4TextConfig(
            vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=8, num_kv_shared_layers=2,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            sliding_window=8, vocab_size_per_layer_input=99, hidden_size_per_layer_input=16, enable_moe_block=True,
            moe_intermediate_size=16, top_k_experts=2, num_experts=4, use_bidirectional_attention="vision",
            pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    else:  # Gemma3nTextModelTester
        config = Gemma3nTextConfig(
            vocab_size=99, vocab_size_per_layer_input=99, hidden_size=16, hidden_size_per_layer_input=16,
            num_hidden_layers=4, num_kv_shared_layers=2,
            layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
            num_attention_heads=2, num_key_value_heads=2, head_dim=8, altup_num_inputs=2, intermediate_size=21,
            hidden_activation="gelu_pytorch_tanh", activation_sparsity_pattern=None, sliding_window=8,
            pad_token_id=0, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sharpen(model, 3.0)  # peaked outputs: drafts are accepted and rejected
    return model.eval()


@pytest.mark.parametrize("kind", ["gemma4", "gemma3n"])
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "vegas", "streaming", "quest", "auto"])
def test_shared_kv_equals_plain(kind, strategy):
    model = _shared(kind)
    strategy_equals_plain(model, strategy)


@pytest.mark.parametrize("kind", ["gemma4", "gemma3n"])
def test_shared_kv_equals_plain_on_the_triton_backend(kind):
    """The Triton backend (its kernels interpreted off a GPU) on the shared layers too, a noisy draft model."""
    model = _shared(kind)
    speculation = {"strategy": "draft_model", "num_draft_tokens": 4, "attention_backend": "triton",
                   "cuda_graphs": False}  # fmt: skip
    stats = equal_plain(model, speculation, draft_model=noisy_copy(model))
    assert stats.mean_acceptance_length > 1.0


def test_shared_layers_read_their_source_layers_cache():
    """Each shared layer maps to the last non-shared layer of its attention kind, and the cache holds one entry for
    both (its bytes counted once); Gemma 4's prefill asks for its last logit by tensor index."""
    gemma4, gemma3n = _shared("gemma4"), _shared("gemma3n")
    assert kv_shared_sources(gemma4) == {2: 0, 3: 1}  # sliding, full, [sliding <- 0], [full <- 1]
    assert kv_shared_sources(gemma3n) == {2: 0, 3: 1}
    cache = SpecCache(4, 1, 16, shared_layers={2: 0, 3: 1})
    assert cache.layers[2] is cache.layers[0] and cache.layers[3] is cache.layers[1]
    cache.layers[0].lazy_initialization(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert cache.nbytes == cache.layers[0].keys.nbytes + cache.layers[0].values.nbytes
    assert torch.equal(last_logit(gemma4), torch.tensor([-1])) and last_logit(_plain_llama()) == 1


def test_shared_layers_without_a_source_are_refused():
    """Every layer shared (its keys and values come from outside the model): refused, naming the cache layer kind."""
    from types import SimpleNamespace

    from hf_sparse_verify._compat import _cacheless

    text = SimpleNamespace(layer_types=["full_attention"] * 2, kv_sharing_modes=["reuse", "reuse"])
    assert _cacheless(text, ["dummy", "dummy"]) == frozenset()
    model = _shared("gemma4")
    assert architecture_refusal(model) is None


def _plain_llama():
    from conftest import make_model

    return make_model("llama", num_hidden_layers=2)
