"""Attention modules that never call `AttentionInterface`, replaced for the call (`speculation_mode`):
GPT-J and CodeGen (before transformers 5.24, which makes them dispatch themselves), GPT-Neo (global and local
layers). Greedy output equals plain ``generate`` token for token (float32, left-padded batch of 2) for every strategy;
the replacements ran; the originals are back after every call, also after an error."""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
from arch_survey import MAX_NEW, PAD, prompts
from transformers import (
    CodeGenConfig,
    CodeGenForCausalLM,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoConfig,
    GPTNeoForCausalLM,
)
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

import hf_sparse_verify as hsv
from hf_sparse_verify import _compat
from hf_sparse_verify.attention import NAME
from hf_sparse_verify.integrations import (
    CodeGenAttentionDispatch,
    GPTJAttentionDispatch,
    GPTNeoAttentionDispatch,
    Mode,
    speculation_mode,
)
from hf_sparse_verify.integrations.switch import ATTENTION_REPLACEMENTS

_COMMON = dict(vocab_size=96, pad_token_id=PAD, eos_token_id=1, bos_token_id=2, tie_word_embeddings=False)

#: variant name -> (model class, config, the replacement class)
MODELS = {
    "gptj": (
        GPTJForCausalLM,
        GPTJConfig(n_embd=64, n_layer=2, n_positions=512, n_head=4, rotary_dim=8, **_COMMON),
        GPTJAttentionDispatch,
    ),
    # rotary over every feature of the head
    "gptj_full_rotary": (
        GPTJForCausalLM,
        GPTJConfig(n_embd=64, n_layer=2, n_positions=512, n_head=4, rotary_dim=16, **_COMMON),
        GPTJAttentionDispatch,
    ),
    # the fused projection of 4 model-parallel shards; 8 heads, 2 per shard
    "codegen": (
        CodeGenForCausalLM,
        CodeGenConfig(n_embd=64, n_layer=2, n_positions=512, n_head=8, rotary_dim=4, **_COMMON),
        CodeGenAttentionDispatch,
    ),
    # a global then a local layer; the window (5 slots) is shorter than the prompts
    "gpt_neo": (
        GPTNeoForCausalLM,
        GPTNeoConfig(
            hidden_size=64,
            num_heads=4,
            num_layers=2,
            attention_types=[[["global", "local"], 1]],
            window_size=5,
            max_position_embeddings=512,
            **_COMMON,
        ),
        GPTNeoAttentionDispatch,
    ),
}
STRATEGIES = {
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "streaming": dict(strategy="streaming", num_draft_tokens=3, ratio=0.3, min_tokens=4, streaming_sinks=2),
}


@functools.cache
def _model(variant: str) -> torch.nn.Module:
    """A tiny float32 random model in eval mode (2 layers, vocabulary 96), its weights scaled up for peaked
    (repetitive) outputs, so drafts are both accepted and rejected."""
    cls, config, _ = MODELS[variant]
    config = copy.deepcopy(config)
    torch.manual_seed(1)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "wte" not in name:
                p.mul_(3.0)
    return model


def _common() -> dict:
    ids, mask = prompts()
    return dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


def _attention_modules(model) -> list[torch.nn.Module]:
    return [getattr(block.attn, "attention", block.attn) for block in model.transformer.h]  # GPT-Neo nests it


def _runs_own_attention(variant: str) -> bool:
    """Whether the variant's attention modules run their own attention (so they are replaced): GPT-Neo always,
    GPT-J and CodeGen before transformers 5.24."""
    module = _attention_modules(_model(variant))[0]
    return any(claims(module) for claims, _ in ATTENTION_REPLACEMENTS)


def _attending_class(variant: str) -> type:
    """The class whose modules call the attention function during our calls: the replacement, or the model's own
    module where it dispatches through `AttentionInterface` itself."""
    if _runs_own_attention(variant):
        return MODELS[variant][2]
    return type(_attention_modules(_model(variant))[0])


def _needs_replacement(variant: str) -> None:
    if not _runs_own_attention(variant):
        pytest.skip(
            f"{variant}: this transformers version's attention dispatches through AttentionInterface itself"
        )


@contextlib.contextmanager
def _sdpa(model):
    """transformers' SDPA attention function and 4D mask for the replaced modules (these models default to their
    own eager attention, which the replacements do not run)."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = "sdpa"
    try:
        yield
    finally:
        model.config._attn_implementation = previous


@pytest.mark.parametrize("variant", list(MODELS))
def test_replacement_computes_what_the_original_computes(variant):
    """Under transformers' SDPA attention (its 4D mask, a `DynamicCache`), the replaced model's logits and greedy
    output equal the original's: projections, rotary embedding and cache update are the model's own."""
    _needs_replacement(variant)
    model = _model(variant)
    common = _common()
    ids, mask = common["input_ids"], common["attention_mask"]
    with torch.no_grad():
        expected_logits = model(input_ids=ids, attention_mask=mask).logits
        expected = model.generate(**common)
        with (
            speculation_mode(model, mode=Mode(attention=False, dispatch_attention=True)) as switched,
            _sdpa(model),
        ):
            assert sum(switched.counts.values()) == model.config.num_hidden_layers
            logits = model(input_ids=ids, attention_mask=mask).logits
            out = model.generate(**common)
    real = mask.bool()  # logits of padding positions are not compared
    torch.testing.assert_close(logits[real], expected_logits[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("variant", list(MODELS))
def test_greedy_equals_plain_generate(attended, variant, strategy):
    model = _model(variant)
    originals = _attention_modules(model)
    implementation = model.config._attn_implementation
    common = _common()
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common,
            custom_generate=hsv.generate,
            speculation=STRATEGIES[strategy],
            return_dict_in_generate=True,
        )
    assert torch.equal(out.sequences, expected)
    accepted = [a for row in out.speculation.accepted_tokens for a in row if a is not None]
    assert any(a > 0 for a in accepted) and any(a < 3 for a in accepted)
    assert set(attended) == {_attending_class(variant).__name__}
    assert _attention_modules(model) == originals
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("variant", list(MODELS))
def test_admitted(variant):
    assert _compat.architecture_refusal(_model(variant)) is None


class _Boom(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        raise RuntimeError("boom")


@pytest.mark.parametrize("variant", list(MODELS))
def test_originals_restored_after_an_error(variant):
    model = _model(variant)
    originals = _attention_modules(model)
    implementation = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        model.generate(
            **_common(),
            custom_generate=hsv.generate,
            speculation=STRATEGIES["vegas"],
            stopping_criteria=StoppingCriteriaList([_Boom()]),
        )
    assert _attention_modules(model) == originals
    assert model.config._attn_implementation == implementation
    with pytest.raises(RuntimeError, match="inside"), speculation_mode(model):
        assert {type(m) for m in _attention_modules(model)} == {_attending_class(variant)}
        assert model.config._attn_implementation == NAME
        raise RuntimeError("inside")
    assert _attention_modules(model) == originals
    assert model.config._attn_implementation == implementation


@pytest.mark.parametrize("variant", list(MODELS))
def test_replacement_shares_weights(variant):
    _needs_replacement(variant)
    model = _model(variant)
    original = _attention_modules(model)[0]
    replaced = MODELS[variant][2](original, model.config)
    shared = [
        name
        for name in replaced.reads
        if isinstance(getattr(original, name, None), torch.Tensor | torch.nn.Module)
    ]
    assert shared and all(getattr(replaced, name) is getattr(original, name) for name in shared)
    with pytest.raises(ValueError, match="leave it in place"):
        MODELS[variant][2](torch.nn.Linear(2, 2), model.config)


def test_codegen_replacement_needs_the_model_config():
    """``CodeGenAttention`` keeps no config; its replacement reads ``_attn_implementation`` from the model's."""
    _needs_replacement("codegen")
    model = _model("codegen")
    with pytest.raises(ValueError, match="keeps no config"):
        CodeGenAttentionDispatch(_attention_modules(model)[0])
    with speculation_mode(model, mode=Mode(attention=False, dispatch_attention=True)):
        assert all(m.config is model.config for m in _attention_modules(model))


@pytest.mark.parametrize("variant", ["gptj", "codegen", "gpt_neo"])
def test_triton_backend(attended, variant):
    """The triton backend (here Triton's CPU interpreter) over the replaced modules' key/value views."""
    model = _model(variant)
    common = _common()
    speculation = dict(attention_backend="triton", cuda_graphs=False, **STRATEGIES["vegas"])
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(**common, custom_generate=hsv.generate, speculation=speculation)
    assert torch.equal(out, expected)
    assert set(attended) == {_attending_class(variant).__name__}
