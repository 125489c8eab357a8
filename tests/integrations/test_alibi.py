"""ALiBi (BLOOM, MPT): the ``"sparse_verify"`` attention adds ``slope * j`` to the logit of cache slot ``j``
(`LogitMods.alibi`), and their attention modules, which add their model's ALiBi tensor themselves, are replaced for
the call by modules that pass their slopes (`integrations.bloom`, `integrations.mpt`). Greedy output equals plain ``generate`` token for
token (float32, a left-padded batch of 2) for every lossless strategy, also on the Triton backend; the originals are
back after the call."""

from __future__ import annotations

import pytest
import torch
from conftest import equal_plain, noisy_copy, sharpen, strategy_equals_plain
from transformers import BloomConfig, BloomForCausalLM, MptConfig, MptForCausalLM

from hf_sparse_verify.attention.eager import LogitMods, _attention_with_logits
from hf_sparse_verify.integrations import BloomAttentionDispatch, MptAttentionDispatch, speculation_mode
from hf_sparse_verify.integrations.bloom import alibi_slopes
from hf_sparse_verify.integrations.mpt import alibi_slopes as mpt_slopes


def _model(kind: str) -> torch.nn.Module:
    # the model testers' sizes (vocabulary 99, hidden 32, 4 heads), two layers
    if kind == "mpt":
        config = MptConfig(vocab_size=99, d_model=32, n_layers=2, n_heads=4, expansion_ratio=2, max_seq_len=512,
                           pad_token_id=0, eos_token_id=1, bos_token_id=2)  # fmt: skip
        cls = MptForCausalLM
    else:
        config = BloomConfig(vocab_size=99, hidden_size=32, n_layer=2, n_head=4, pad_token_id=0, eos_token_id=1,
                             bos_token_id=2)  # fmt: skip
        cls = BloomForCausalLM
    torch.manual_seed(0)
    model = cls(config).eval()
    sharpen(model, 3.0, ("word_embeddings", "wte"))  # peaked outputs: drafts are accepted and rejected
    return model


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "vegas", "streaming", "quest", "auto"])
def test_alibi_models_equal_plain(kind, strategy):
    model = _model(kind)
    strategy_equals_plain(model, strategy)


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_alibi_models_equal_plain_on_the_triton_backend(kind):
    model = _model(kind)
    speculation = {"strategy": "draft_model", "num_draft_tokens": 4, "attention_backend": "triton",
                   "cuda_graphs": False}  # fmt: skip
    equal_plain(model, speculation, draft_model=noisy_copy(model))


@pytest.mark.parametrize("kind", ["bloom", "mpt"])
def test_replacements_run_and_are_undone(kind):
    model = _model(kind)
    blocks = model.transformer.h if kind == "bloom" else model.transformer.blocks
    name, cls = (
        ("self_attention", BloomAttentionDispatch) if kind == "bloom" else ("attn", MptAttentionDispatch)
    )
    originals = [getattr(block, name) for block in blocks]
    with speculation_mode(model) as switched:
        assert all(isinstance(getattr(b, name), cls) for b in blocks) and switched.counts
    assert [getattr(block, name) for block in blocks] == originals


def test_mpt_slopes_are_its_biases_per_key():
    """MPT's bias for key ``j`` of ``n`` is ``slope * (j - n + 1)`` (transformers' tensor)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    slopes = mpt_slopes(6, 8, "cpu")  # 6 heads: not a power of two, MPT interleaves the slopes
    bias = build_mpt_alibi_tensor(6, 5, 8)  # [H, 1, 5]
    torch.testing.assert_close(bias[:, 0, :], slopes[:, None] * (torch.arange(5) - 4).float())


def test_alibi_logits_equal_blooms_up_to_a_row_constant():
    """``slope * j`` against BLOOM's ``slope * (j - pad)``: the same attention, padded slots masked."""
    torch.manual_seed(0)
    batch, heads, length, dim = 2, 4, 10, 8
    q, k, v = (
        torch.randn(batch, heads, 3, dim),
        torch.randn(batch, heads, length, dim),
        torch.randn(batch, heads, length, dim),
    )
    pad = torch.tensor([0, 4])
    slots = torch.arange(length)
    mask = (slots[None, :] >= pad[:, None])[:, None, None, :].expand(batch, heads, 3, length)
    slopes = alibi_slopes(heads, "cpu")
    out, _ = _attention_with_logits(q, k, v, mask, 0.5, LogitMods(alibi=slopes))
    positions = (slots[None, :] - pad[:, None]).clamp_min(0).float()  # BLOOM's key positions
    logits = q @ k.transpose(-1, -2) * 0.5 + slopes.view(1, heads, 1, 1) * positions[:, None, None, :]
    expected = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1) @ v
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
