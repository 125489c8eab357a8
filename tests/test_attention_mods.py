"""The reference attention's logit modifications against transformers' own eager attention: soft-capping (Gemma 2),
attention sinks (GPT-OSS) and a value head size other than the key's (MLA), over a left-padded causal mask with
grouped query heads."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

from hf_sparse_verify.attention.reference import LogitMods, _attention_with_logits

B, H, H_KV, Q, L, D = 2, 4, 2, 3, 11, 16


def _inputs(v_dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, Q, D, generator=gen, dtype=torch.float32)
    key = torch.randn(B, H_KV, L, D, generator=gen, dtype=torch.float32)
    value = torch.randn(B, H_KV, L, v_dim, generator=gen, dtype=torch.float32)
    pad = torch.tensor([0, 4])
    slots = torch.arange(L)
    own = torch.arange(L - Q, L)
    mask = (slots[None, None, :] <= own[None, :, None]) & (slots[None, None, :] >= pad[:, None, None])
    return query, key, value, mask[:, None]  # mask [B, 1, Q, L]


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=torch.float32).masked_fill(~mask, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("v_dim", [D, 12])
def test_softcap_matches_gemma2_eager(v_dim):
    query, key, value, mask = _inputs(v_dim)
    module = types.SimpleNamespace(num_key_value_groups=H // H_KV, training=False)
    want, _ = gemma2_eager(
        module, query, key, value, _additive(mask), scaling=0.3, softcap=2.0
    )  # [B, Q, H, Dv]
    got, logits = _attention_with_logits(query, key, value, mask, 0.3, LogitMods(softcap=2.0))
    torch.testing.assert_close(got.transpose(1, 2), want)
    assert logits.abs().max() <= 2.0  # the logits a score collection reads are the capped ones


@pytest.mark.parametrize("v_dim", [D, 12])
def test_sinks_match_gpt_oss_eager(v_dim):
    query, key, value, mask = _inputs(v_dim)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float32)
    module = types.SimpleNamespace(num_key_value_groups=H // H_KV, training=False, sinks=sinks)
    want, _ = gpt_oss_eager(module, query, key, value, _additive(mask), scaling=0.3)
    got, _ = _attention_with_logits(query, key, value, mask, 0.3, LogitMods(sinks=sinks))
    torch.testing.assert_close(got.transpose(1, 2), want)
