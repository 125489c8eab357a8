"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-MoE-DSA: transformers' ``indexed_attention`` cache layers): an
indexer scores every cache slot for each query and the attention reads only its top-k. The indexer's keys live in
the cache beside the layer's keys (`SpecLayer.update_indexer`, written at the step's slots, so rejected drafts are
overwritten as keys are), the indexer masks its scores with the step's mask, and the attention applies each query's
own top-k (`interface.selected_attention`), so a verify step of K + 1 tokens gives each token the selection plain
decoding would. Greedy output equals plain ``generate`` (float32, a ragged batch) with a top-k far below the prompt,
drafts rejected part-way; self-speculation is refused with the reason."""

from __future__ import annotations

import pytest
import torch
from conftest import equal_plain, noisy_copy, sharpen, strategy_equals_plain
from transformers import AutoModelForCausalLM, DeepseekV32Config

import hf_sparse_verify as hsv
from hf_sparse_verify.attention.cache import SpecCache
from hf_sparse_verify.step import Phase, StepContext, step_scope


def _dsa(topk: int = 8) -> torch.nn.Module:
    config = DeepseekV32Config(
        vocab_size=99, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        mlp_layer_types=["dense", "sparse"], num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, index_topk=topk, index_head_dim=16,
        index_n_heads=4, max_position_embeddings=512, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sharpen(model, 3.0)  # peaked outputs: drafts are accepted and rejected
    return model.eval()


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "auto"])
def test_dsa_equals_plain(strategy):
    model = _dsa()
    strategy_equals_plain(model, strategy)


def test_dsa_equals_plain_on_the_triton_backend():
    model = _dsa()
    speculation = {"strategy": "draft_model", "num_draft_tokens": 4, "attention_backend": "triton",
                   "cuda_graphs": False}  # fmt: skip
    equal_plain(model, speculation, draft_model=noisy_copy(model))


def test_the_selection_matters():
    """With top-k 8 of 40+ slots the output differs from the same weights attending everywhere, so the equality
    above is not the selection doing nothing."""
    sparse, dense = _dsa(8), _dsa(4096)
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.allclose(sparse(input_ids=ids).logits, dense(input_ids=ids).logits)


def test_self_speculation_is_refused_with_the_reason():
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NotImplementedError, match="DSA indexer"):
        _dsa().generate(input_ids=ids, max_new_tokens=4, pad_token_id=0, custom_generate=hsv.generate,
                        speculation={"strategy": "vegas"})  # fmt: skip


def test_indexer_keys_are_written_at_the_step_slots():
    cache = SpecCache(1, 2, 16)
    start, pad = torch.tensor([0, 3]), torch.tensor([0, 3])
    with step_scope(StepContext(Phase.PREFILL, start, pad, q_len=4, kv_len=7)):
        keys = cache.update_indexer(torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 4, 2), 0)
    assert keys.shape == (2, 7, 2)  # the slots the step reads
    assert torch.equal(keys[1, 3:7], torch.arange(8, 16, dtype=torch.float32).view(4, 2))
    assert keys[1, :3].eq(0).all() and cache.layers[0].indexer_keys.shape == (2, 16, 2)
    assert cache.nbytes == cache.layers[0].indexer_keys.nbytes  # no keys written yet: the indexer's alone


def test_an_indexer_that_keeps_its_key_positions_on_the_cache_is_refused():
    """Qwen4-Exp (transformers' model-tester sizes) appends its indexer's key positions to the cache each call, as if
    the new tokens took the last slots; that does not hold for rows that accepted different numbers of drafts, so
    the model is refused with the reason (before: an AttributeError deep in its forward), and plain generate runs."""
    from transformers import Qwen4ExpTextConfig

    config = Qwen4ExpTextConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=2, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=4,
        linear_num_value_heads=8, moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts_per_tok=2,
        num_experts=4, layer_types=["linear_attention", "indexed_attention"], hc_count=2, hc_lowrank=8,
        ple_layer_ids=[1], ple_embed_dim=16, ple_conv_kernel_size=2, ngram_size=3, heads_per_ngram=2,
        ngram_vocab_size_base=31, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=4, indexer_n_heads=2,
        indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4, indexer_compress_ratio=2, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25, "rope_theta": 10000.0},
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids = torch.randint(3, 99, (2, 10))
    for strategy in ("prompt_lookup", "draft_model"):
        extra = {"draft_model": noisy_copy(model)} if strategy == "draft_model" else {}
        with pytest.raises(NotImplementedError, match="indexer_position_ids"):
            model.generate(
                ids, max_new_tokens=4, do_sample=False, custom_generate=hsv.generate,
                speculation=dict(strategy=strategy), **extra,
            )  # fmt: skip
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape == (2, 14)
