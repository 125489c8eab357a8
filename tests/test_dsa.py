"""DeepSeek Sparse Attention models (DeepSeek-V3.2, GLM-MoE-DSA) under speculation: their attention runs in MLA's
latent space over the selected slots only (`integrations.mla.SparseMLAAttention`, `kernels.sparse_mla`), greedy
output equal to plain ``generate`` in float32 with a top-k smaller than the context (so the selection matters),
a left-padded batch, prompt lookup and a noisy draft model (drafts rejected part-way, so the indexer's key cache
and the latent cache roll back); GLM-MoE-DSA with a ``"shared"`` layer that reuses the previous layer's top-k."""

from __future__ import annotations

import pytest
import torch
from arch_survey import _from_config, tiny_config
from conftest import noisy_copy

import hf_sparse_verify as hsv
from hf_sparse_verify.integrations import mla
from hf_sparse_verify.integrations.switch import Mode, speculation_mode

TOP_K = 6


def dsa_model(model_type: str) -> torch.nn.Module:
    config = tiny_config(model_type)
    config.index_topk = TOP_K
    if model_type == "glm_moe_dsa":
        config.indexer_types = ["full", "shared"]  # layer 1 reuses layer 0's top-k
    return _from_config(config, seed=0)


def _prompts(vocab: int, length: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (2, length), generator=torch.Generator().manual_seed(0))
    ids[:, -10:] = ids[:, -20:-10]  # text prompt lookup finds
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask


@pytest.mark.parametrize("length", [30, 45])  # 45: the prefill takes the expanded path (more than 31 queries)
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_mla_equals_plain_generate(model_type, strategy, length):
    model = dsa_model(model_type)
    extra = {"draft_model": noisy_copy(model)} if strategy == "draft_model" else {}
    ids, mask = _prompts(model.get_input_embeddings().weight.shape[0], length)
    common = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common, custom_generate=hsv.generate, return_dict_in_generate=True,
            speculation=dict(strategy=strategy, num_draft_tokens=3), **extra,
        )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    assert sum(out.speculation.draft_tokens) > 0  # verify steps of several queries ran (the merged schedule)
    if strategy == "draft_model":
        assert out.speculation.mean_acceptance_length > 1.0


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_attention_is_replaced_for_the_call_only(model_type):
    model = dsa_model(model_type)
    originals = [layer.self_attn for layer in model.model.layers]
    with speculation_mode(model, mode=Mode()) as switched:
        assert all(isinstance(layer.self_attn, mla.SparseMLAAttention) for layer in model.model.layers)
        assert switched.counts["SparseMLAAttention"] == len(originals)
    assert [layer.self_attn for layer in model.model.layers] == originals


def test_latent_attention_reads_the_selection_not_the_whole_cache(monkeypatch):
    """Poisoning the latent rows no query selected changes nothing; poisoning a selected one changes the output."""
    model = dsa_model("deepseek_v32")
    seen = {}

    def spy(q_lat, q_rot, latent, rot, indices, allowed, scaling):
        seen.setdefault("args", (q_lat, q_rot, latent, rot, indices, allowed, scaling))
        return real(q_lat, q_rot, latent, rot, indices, allowed, scaling)

    real = mla.sparse_mla
    monkeypatch.setattr(mla, "sparse_mla", spy)
    ids, mask = _prompts(model.get_input_embeddings().weight.shape[0])
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=2, pad_token_id=0,
                       custom_generate=hsv.generate, speculation=dict(strategy="prompt_lookup"))  # fmt: skip
    q_lat, q_rot, latent, rot, indices, allowed, scaling = seen["args"]
    picked = torch.zeros(allowed.shape[0], latent.shape[1], dtype=torch.bool)
    for b in range(allowed.shape[0]):
        for i in range(allowed.shape[1]):
            for s in indices[b, i].tolist():
                if s < allowed.shape[2] and allowed[b, i, s]:
                    picked[b, s] = True
    assert picked.any() and not picked[:, : allowed.shape[2]].all()  # the top-k is smaller than the prompt
    base = real(q_lat, q_rot, latent, rot, indices, allowed, scaling)
    poisoned = latent.clone()
    poisoned[~picked] = 1e4
    torch.testing.assert_close(real(q_lat, q_rot, poisoned, rot, indices, allowed, scaling), base)
    first = picked.nonzero()[0]
    poisoned[first[0], first[1]] = 3.0
    assert not torch.allclose(real(q_lat, q_rot, poisoned, rot, indices, allowed, scaling), base)


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_indexer_scored_by_the_kernel_selects_what_transformers_selects(model_type, dtype, monkeypatch):
    """The replacement's top-k (`hsv::index_scores`, no float32 key copy) equals the indexer module's own, with a
    causal mask over 40 tokens and a top-k of 6, and the scores do come from the op."""
    model = dsa_model(model_type).to(dtype)
    attention = model.model.layers[0].self_attn
    replacement = mla.SparseMLAAttention(attention)
    assert replacement.indexer_rotary is not None
    calls = []
    real = mla.index_scores
    monkeypatch.setattr(mla, "index_scores", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 40, model.config.hidden_size, generator=gen).to(dtype)
    positions = torch.arange(40).expand(2, 40)
    cos, sin = model.model.rotary_emb(hidden, positions)
    causal = torch.ones(40, 40, dtype=torch.bool).tril().expand(2, 40, 40)
    with torch.no_grad():
        q_resid = attention.q_a_layernorm(attention.q_a_proj(hidden))
        expected = attention.indexer(hidden, q_resid, (cos, sin), causal, positions, cache=None)
        got = replacement._select(hidden, q_resid, cos, sin, causal, None)
    assert calls and got.dtype == torch.int32 and got.shape == expected.shape == (2, 40, TOP_K)
    # the same set per query (topk's order among equal scores, e.g. the -inf of masked slots, may differ)
    assert torch.equal(got[:, TOP_K:].sort(-1).values, expected[:, TOP_K:].sort(-1).values)


def test_an_indexer_class_without_a_known_rotary_keeps_its_own_forward(monkeypatch):
    """Where `_compat.indexer_rotary` does not know the indexer's class, the replacement calls the indexer module
    itself (and never the kernel); greedy output still equals plain ``generate``."""
    from hf_sparse_verify import _compat

    monkeypatch.setattr(_compat, "_INDEXER_ROTARY", {})
    monkeypatch.setattr(mla, "index_scores", lambda *a: pytest.fail("index_scores called"))
    model = dsa_model("deepseek_v32")
    assert mla.SparseMLAAttention(model.model.layers[0].self_attn).indexer_rotary is None
    ids, mask = _prompts(model.get_input_embeddings().weight.shape[0])
    common = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(**common, custom_generate=hsv.generate,
                             speculation=dict(strategy="prompt_lookup", num_draft_tokens=3))  # fmt: skip
    assert torch.equal(out, expected)
