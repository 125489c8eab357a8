"""Falcon (rotary): its attention modules are replaced for the call by `FalconAttentionDispatch`, which dispatches
through `AttentionInterface`; greedy output equals plain ``generate`` token for token (float32, left-padded batch of
2) in every projection layout. ALiBi Falcon is refused by reason; the originals are back after every call."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from arch_survey import MAX_NEW, PAD, prompts
from transformers import FalconConfig, FalconForCausalLM
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

import hf_sparse_verify as hsv
from hf_sparse_verify import _compat
from hf_sparse_verify.attention import NAME, triton_backend
from hf_sparse_verify.integrations import FalconAttentionDispatch, Mode, speculation_mode

#: the dispatching replacements alone, under the model's own attention implementation
DISPATCH = Mode(attention=False, dispatch_attention=True)

#: projection layouts of `hf_sparse_verify.integrations.falcon`, and the decoder-layer variants around them
LAYOUTS = {
    # Falcon-7B: one key/value head, attention and MLP in parallel off one layer norm
    "multi_query": dict(multi_query=True, new_decoder_architecture=False, parallel_attn=True),
    # Falcon-40B/180B, Falcon 2: grouped key/value heads, two layer norms
    "grouped": dict(new_decoder_architecture=True, num_kv_heads=2),
    # plain multi-head attention, sequential attention then MLP, biases
    "multi_head_sequential": dict(
        multi_query=False, new_decoder_architecture=False, parallel_attn=False, bias=True
    ),
}
STRATEGIES = {
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "streaming": dict(strategy="streaming", num_draft_tokens=3, ratio=0.3, min_tokens=4, streaming_sinks=2),
}


def falcon(layout: str, seed: int = 1, **overrides) -> FalconForCausalLM:
    """A tiny float32 random rotary Falcon in eval mode, its weights scaled up for peaked (repetitive) outputs."""
    config = FalconConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        **{
            "max_position_embeddings": 512,
            "alibi": False,
            "pad_token_id": PAD,
            "eos_token_id": 1,
            "bos_token_id": 2,
            "tie_word_embeddings": False,
            **LAYOUTS[layout],
            **overrides,
        },
    )
    torch.manual_seed(seed)
    model = FalconForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "word_embeddings" not in name:
                p.mul_(3.0)
    return model


@functools.cache
def _model(layout: str) -> FalconForCausalLM:
    return falcon(layout, seed=1)  # drafts are both accepted and rejected in every layout and strategy


def _common() -> dict:
    ids, mask = prompts()
    return dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD)


def _attention_classes(model) -> set[str]:
    return {type(layer.self_attention).__name__ for layer in model.transformer.h}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_replacement_computes_what_falcon_computes(layout):
    """Under transformers' own SDPA attention (its 4D mask, a `DynamicCache`), the replaced model's greedy output
    and logits equal the original's: the split, the rotary embedding and the cache update are Falcon's."""
    model = _model(layout)
    common = _common()
    ids, mask = common["input_ids"], common["attention_mask"]
    with torch.no_grad():
        expected_logits = model(input_ids=ids, attention_mask=mask).logits
        expected = model.generate(**common)
        with speculation_mode(model, mode=DISPATCH) as switched:
            assert switched.counts == {"FalconAttentionDispatch": model.config.num_hidden_layers}
            assert model.config._attn_implementation == "sdpa"
            logits = model(input_ids=ids, attention_mask=mask).logits
            out = model.generate(**common)
    real = mask.bool()  # logits of padding positions are not compared
    torch.testing.assert_close(logits[real], expected_logits[real], rtol=1e-5, atol=1e-5)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_greedy_equals_plain_generate(attended, layout, strategy):
    model = _model(layout)
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
    assert set(attended) == {"FalconAttentionDispatch"}
    assert _attention_classes(model) == {"FalconAttention"}
    assert model.config._attn_implementation == "sdpa"


def test_draft_model_is_replaced_too():
    """A Falcon draft model runs through the same attention: its modules are replaced as the target's are."""
    model = _model("grouped")
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.1 * p.std().clamp_min(1e-3))
    common = _common()
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common,
            custom_generate=hsv.generate,
            speculation=dict(strategy="draft_model", num_draft_tokens=3),
            draft_model=draft,
            return_dict_in_generate=True,
        )
    assert torch.equal(out.sequences, expected)
    assert sum(a for row in out.speculation.accepted_tokens for a in row if a is not None) > 0
    assert _attention_classes(draft) == {"FalconAttention"}


@pytest.mark.parametrize("strategy", ["prompt_lookup", "vegas"])
def test_triton_backend(attended, monkeypatch, strategy):
    """The triton backend (here Triton's CPU interpreter): the cache-write and decode-attention kernels read
    Falcon's strided key/value views."""
    kernel_calls, decode = [], triton_backend.decode_attention

    def spy(*args, **kwargs):
        kernel_calls.append(kwargs.get("collect"))
        return decode(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "decode_attention", spy)
    model = _model("multi_query")
    common = _common()
    speculation = dict(attention_backend="triton", cuda_graphs=False, **STRATEGIES[strategy])
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(**common, custom_generate=hsv.generate, speculation=speculation)
    assert torch.equal(out, expected)
    assert set(attended) == {"FalconAttentionDispatch"} and kernel_calls


def test_alibi_is_refused():
    model = falcon("multi_query", alibi=True)
    assert "ALiBi" in _compat.architecture_refusal(model)
    with pytest.raises(
        NotImplementedError,
        match=r"model type 'falcon' \(FalconForCausalLM\) is not supported: it adds ALiBi position biases .*"
        r"config\.alibi=False",
    ):
        model.generate(**_common(), custom_generate=hsv.generate, speculation=STRATEGIES["prompt_lookup"])
    with speculation_mode(model, mode=DISPATCH) as switched:  # never replaced
        assert switched.counts == {}
    with speculation_mode(model):  # its own attention modules cannot run under "sparse_verify"
        assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="ALiBi"):
        FalconAttentionDispatch(model.transformer.h[0].self_attention)


def test_rotary_falcon_is_admitted():
    for layout in LAYOUTS:
        assert _compat.architecture_refusal(_model(layout)) is None


class _Boom(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        raise RuntimeError("boom")


def test_originals_restored_after_an_error():
    model = _model("grouped")
    originals = [layer.self_attention for layer in model.transformer.h]
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        model.generate(
            **_common(),
            custom_generate=hsv.generate,
            speculation=STRATEGIES["vegas"],
            stopping_criteria=StoppingCriteriaList([_Boom()]),
        )
    assert [layer.self_attention for layer in model.transformer.h] == originals
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), speculation_mode(model):
        assert _attention_classes(model) == {"FalconAttentionDispatch"}
        assert model.config._attn_implementation == NAME
        raise RuntimeError("inside")
    assert [layer.self_attention for layer in model.transformer.h] == originals
    assert model.config._attn_implementation == "sdpa"


def test_replacement_shares_weights():
    model = _model("multi_query")
    original = model.transformer.h[0].self_attention
    replaced = FalconAttentionDispatch(original)
    assert replaced.query_key_value is original.query_key_value and replaced.dense is original.dense
    assert (replaced.num_key_value_heads, replaced.num_key_value_groups) == (1, 4)
    assert FalconAttentionDispatch(_model("grouped").transformer.h[0].self_attention).num_key_value_heads == 2
