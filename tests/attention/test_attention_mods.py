"""The reference attention's logit modifications against transformers' own eager attention: soft-capping (Gemma 2),
attention sinks (GPT-OSS) and a value head size other than the key's (MLA), over a left-padded causal mask with
grouped query heads."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma2_eager
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

from hf_sparse_verify.attention.eager import LogitMods, _attention_with_logits

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


@pytest.mark.parametrize("mod", ["softcap", "sinks", "both"])
def test_decode_kernel_matches_eager(mod):
    """The decode-attention kernel (Triton interpreter on CPU) with soft-capping and sinks against transformers'
    Gemma 2 / GPT-OSS eager attention over the same left-padded cache (queries at the last Q slots)."""
    from hf_sparse_verify.kernels.decode_attention import decode_attention

    query, key, value, mask = _inputs(D, seed=3)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float32)
    module = types.SimpleNamespace(num_key_value_groups=H // H_KV, training=False, sinks=sinks)
    softcap = 2.0 if mod in ("softcap", "both") else 0.0
    use_sinks = mod in ("sinks", "both")
    if use_sinks:  # written out (GPT-OSS eager has no soft-capping; without the cap it is checked against it)
        logits = torch.matmul(query, key.repeat_interleave(H // H_KV, dim=1).transpose(-1, -2)) * 0.3
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        logits = logits + _additive(mask)
        full = torch.cat([logits, sinks[None, :, None, None].expand(B, H, Q, 1)], dim=-1)
        probs = torch.softmax(full, dim=-1)[..., :L]
        want = torch.matmul(probs, value.repeat_interleave(H // H_KV, dim=1)).transpose(1, 2)
        if not softcap:
            eager, _ = gpt_oss_eager(module, query, key, value, _additive(mask), scaling=0.3)
            torch.testing.assert_close(want, eager)  # the hand-written form is GPT-OSS's
    else:
        want, _ = gemma2_eager(module, query, key, value, _additive(mask), scaling=0.3, softcap=softcap)
    start, pad = torch.full((B,), L - Q), torch.tensor([0, 4])
    got, _ = decode_attention(
        query, key, value, start, pad, 0.3, softcap=softcap, sinks=sinks if use_sinks else None, num_splits=2
    )
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("strategy", ["prompt_lookup", "vegas"])
@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss"])
def test_triton_backend_with_mods_equals_plain_generate(model_type, strategy, monkeypatch):
    """End to end on the ``triton`` backend (Triton interpreter on CPU): soft-capped (Gemma 2) and sink (GPT-OSS)
    layers' verify steps run the decode-attention kernel, and greedy output equals plain ``generate``."""
    from arch_survey import PAD, build_model, prompts

    import hf_sparse_verify as hsv
    from hf_sparse_verify.kernels._triton import triton_runs_on
    from hf_sparse_verify.kernels.decode_attention import kernel

    if not triton_runs_on(torch.device("cpu")):
        pytest.skip("runs the kernels in the Triton interpreter on CPU tensors (CPU machines; the GPU runs them in "
                    "tests/test_architectures_gpu.py)")  # fmt: skip
    calls = []
    launch = kernel.launch
    monkeypatch.setattr(kernel, "launch", lambda *a, **k: calls.append(a[10:]) or launch(*a, **k))
    model = build_model(model_type)
    ids, mask = prompts()
    common = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, pad_token_id=PAD)
    extra = dict(ratio=0.3, min_tokens=4) if strategy == "vegas" else {}
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common,
            custom_generate=hsv.generate,
            speculation=dict(strategy=strategy, num_draft_tokens=3, attention_backend="triton", **extra),
        )
    assert torch.equal(out, expected)
    softcap, sinks = calls[-1]
    assert (softcap > 0) if model_type == "gemma2" else (sinks is not None)
