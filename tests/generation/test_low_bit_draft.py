"""A low-bit copy of the target as its draft: lossless (the target verifies), the original untouched, and the
rounding visible in acceptance."""

from __future__ import annotations

import doctest

import pytest
import torch
from conftest import make_model, ragged_batch

import hf_sparse_verify as hsv
import hf_sparse_verify.generation.drafters.low_bit as low_bit
from hf_sparse_verify.generation.drafters.low_bit import (
    LowBitLinear,
    LowBitRows,
    draft_weight_bytes,
    low_bit_bytes,
    low_bit_copy,
    low_bit_linears,
)
from hf_sparse_verify.kernels.low_bit import fake_quantize


def tiny_llama(layers: int = 1, **config):
    """A small random Llama (4 query heads over 2 key-value heads, hidden 64) whose projections a low-bit copy
    rounds in groups of 32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, **config,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def projections(draft):
    """``{name: layer}`` of a low-bit copy's projections (`LowBitLinear` or `LowBitRows` of a stacked one)."""
    return {
        n: m
        for n, m in draft.named_modules()
        if isinstance(m, (LowBitLinear, LowBitRows)) and not n.endswith(".whole")
    }


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_greedy_with_a_low_bit_draft_equals_plain_generate(weights):
    model = make_model("llama")
    before = {n: p.clone() for n, p in model.named_parameters()}
    draft = low_bit_copy(model, weights, group_size=16)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the target is untouched
    rounded = projections(draft)
    assert sorted(rounded) == sorted(n for n, _ in low_bit_linears(model)) and not low_bit_linears(draft)
    for name, module in rounded.items():  # each applies its weight rounded through the format
        original = model.get_submodule(name).weight
        assert torch.equal(module.dequantized(), fake_quantize(original, weights, 16, "mse"))
        assert not torch.equal(module.dequantized(), original)
    # everything else is the target's own tensors, not copies
    assert draft.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert draft.model.norm.weight is model.model.norm.weight
    ids, mask = ragged_batch(3)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=23, do_sample=False)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=23, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy="draft_model", num_draft_tokens=4), draft_model=draft,
        return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    accepted = [a for row in out.speculation.accepted_tokens for a in row if a is not None]
    assert sum(accepted) > 0  # the rounded copy still drafts what the target says, often


def test_int4_draft_rounds_more_than_int8():
    model = make_model("llama")
    errors = {}
    for weights in ("int8", "int4"):
        draft = low_bit_copy(model, weights, group_size=16)
        errors[weights] = sum(
            float((m.dequantized() - model.get_submodule(n).weight).detach().abs().mean())
            for n, m in projections(draft).items()
        )
    assert 0 < errors["int8"] < errors["int4"]


def test_bytes_and_bad_input():
    model = make_model("llama")
    sizes = low_bit_bytes(model, "int4", group_size=16)
    assert sizes["low_bit"] < sizes["original"] / 4  # float32 weights: int4 is an eighth plus scales
    draft = low_bit_copy(model, "int4", group_size=16)
    # what the copy holds of its own: packed values (an eighth of float32) and float32 scales
    assert draft_weight_bytes(draft) == sum(
        m.weight.numel() // 2 + 4 * m.weight.numel() // 16 for _, m in low_bit_linears(model)
    )
    with pytest.raises(ValueError, match="one of"):
        low_bit_copy(model, "fp4")


def test_docstring_examples():
    assert doctest.testmod(low_bit).failed == 0


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_low_bit_strategy_equals_plain_generate_and_makes_its_copy_once(weights):
    model = make_model("llama")
    ids, mask = ragged_batch(2)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=17, do_sample=False)
    settings = dict(strategy="low_bit", num_draft_tokens=3, draft_weights=weights, draft_weight_group=16)
    runs = [
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=17,
            do_sample=False,
            custom_generate=hsv.generate,
            speculation=settings,
            return_dict_in_generate=True,
        )  # fmt: skip
        for _ in range(2)
    ]
    for out in runs:
        assert torch.equal(out.sequences, expected)
        assert out.speculation.strategy == "low_bit"
        assert out.speculation.mean_acceptance_length > 1.0  # the copy's drafts are taken
    copies = low_bit._COPIES[model]
    assert list(copies) == [(weights, 16)]  # one copy, reused by the second call
    assert all(
        isinstance(m, LowBitRows)
        for n, m in projections(copies[(weights, 16)]).items()
        if n.endswith("up_proj")
    )


def test_low_bit_strategy_says_which_setting_to_change():
    model = make_model("llama")  # input sizes 32 and 64: groups of 128 do not divide them
    with pytest.raises(ValueError, match="draft_weight_group"):
        model.generate(
            input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=4, custom_generate=hsv.generate,
            speculation=dict(strategy="low_bit", draft_weight_group=128),
        )  # fmt: skip
    assert low_bit.default_group(model) == 32  # the default picks the largest group that divides them
    with pytest.raises(ValueError, match="draft_weight_group"):
        low_bit.default_group(
            make_model("llama", hidden_size=48, intermediate_size=48, num_attention_heads=3)
        )
    with pytest.raises(ValueError, match="draft_weights"):
        hsv.SpeculationConfig(strategy="low_bit", draft_weights="fp4")


@pytest.mark.parametrize(
    "strategy,weights", [("vegas", "int8"), ("vegas", "int4"), ("streaming", "int4"), ("quest", "int4")]
)
def test_self_speculation_with_low_bit_draft_weights_equals_plain_generate(strategy, weights, monkeypatch):
    """Draft steps run the target's low-bit copy over the target's own cache (and its selection); verify steps run
    the model's weights: greedy output is plain generate's, and the copy really drafted."""
    model = make_model("llama")
    calls = []
    forward = LowBitLinear.forward
    monkeypatch.setattr(
        LowBitLinear, "forward", lambda self, x: calls.append(x.shape[-2]) or forward(self, x)
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 40), generator=gen)
    ids[:, 20:] = ids[:, :20]  # text worth drafting
    expected = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
    out = model.generate(
        input_ids=ids, max_new_tokens=12, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy=strategy, num_draft_tokens=3, ratio=0.5, min_tokens=4, draft_weights=weights,
                         draft_weight_group=16),
        return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    assert calls and set(calls) == {1}  # only one-token draft steps ran the low-bit weights
    assert out.speculation.mean_acceptance_length > 1.0
    assert out.speculation.draft_weights == weights
    assert list(low_bit._COPIES[model]) == [(weights, 16)]


def test_auto_takes_the_low_bit_copy_as_a_candidate_when_asked():
    """With draft_weights set and no draft model, auto's members include the low-bit copy (started cold, its
    prefill priced as a whole model's) and greedy output stays plain generate's."""
    from hf_sparse_verify.config import SpeculationConfig
    from hf_sparse_verify.generation.drafters.portfolio import PortfolioDrafter

    model = make_model("llama")
    portfolio = PortfolioDrafter.from_config(SpeculationConfig(draft_weights="int4"), target=model)
    assert list(portfolio.members) == ["prompt_lookup", "low_bit"]
    assert portfolio.planner_members()["low_bit"].warm_share == pytest.approx(1.0, rel=0.01)
    plain = PortfolioDrafter.from_config(SpeculationConfig(), target=model)
    assert list(plain.members) == ["prompt_lookup"]
    ids, mask = ragged_batch(2)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy="auto", draft_weights="int4"), return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    assert out.speculation.draft_weights == "int4"  # the copy its low_bit member holds
    assert plain.low_bit_weights is None


def test_fused_attention_takes_a_low_bit_copys_projections():
    """The copy's attention is replaceable by `FusedQKVAttention` (all four projections low-bit; a mix is not), and
    the replacement computes what the copy's own attention computes (the eager path, as on CPU)."""
    from hf_sparse_verify.integrations.qkv_attention import FusedQKVAttention, replaceable_attention

    torch.manual_seed(0)
    target = tiny_llama()
    copy = low_bit_copy(target, "int4", group_size=32)
    attention = copy.model.layers[0].self_attn
    assert replaceable_attention(attention) and replaceable_attention(target.model.layers[0].self_attn)
    fused = FusedQKVAttention(attention)
    assert fused.low_bit and fused.q_proj is attention.q_proj
    hidden = torch.randn(2, 5, 64)
    position_ids = torch.arange(5)[None].expand(2, -1)
    cos_sin = copy.model.rotary_emb(hidden, position_ids)
    expected, _ = attention(hidden, cos_sin, None)
    got, _ = fused(hidden, cos_sin, None)
    torch.testing.assert_close(got, expected)
    # q / k / v are one stacked layer: the fused projection runs it once and splits its output
    assert fused._qkv is attention.q_proj.whole
    rows, cos, sin = hidden.reshape(10, 64), cos_sin[0].reshape(10, -1), cos_sin[1].reshape(10, -1)
    stacked = fused._project_fused(rows, cos, sin)
    fused._qkv = None  # the three projections one by one
    for a, b in zip(stacked, fused._project_fused(rows, cos, sin)):
        torch.testing.assert_close(a, b)
    attention.o_proj = target.model.layers[0].self_attn.o_proj  # a mix of low-bit and bf16 projections
    assert not replaceable_attention(attention)


def test_low_bit_mlp_runs_gate_and_up_as_one_layer():
    """A copy's MLP (gate and up one stacked layer) is replaceable by `LowBitGatedMLP`, which computes what the
    copy's own MLP computes; a copy made without stacking keeps transformers' MLP."""
    from hf_sparse_verify.integrations.mlp import LowBitGatedMLP, replaceable_low_bit_mlp, replaceable_mlp

    torch.manual_seed(0)
    target = tiny_llama()
    for weights in ("int8", "int4"):
        mlp = low_bit_copy(target, weights, group_size=32).model.layers[0].mlp
        assert replaceable_low_bit_mlp(mlp) and not replaceable_mlp(mlp)
        x = torch.randn(2, 5, 64)
        torch.testing.assert_close(LowBitGatedMLP(mlp)(x), mlp(x))
        apart = low_bit_copy(target, weights, group_size=32, stack=False).model.layers[0].mlp
        assert not replaceable_low_bit_mlp(apart) and isinstance(apart.up_proj, LowBitLinear)
        torch.testing.assert_close(apart(x), mlp(x))  # stacking changes no value
    with pytest.raises(ValueError, match="leave it in place"):
        LowBitGatedMLP(apart)


def test_switch_plans_the_fused_attention_for_a_low_bit_copy(monkeypatch):
    """The swap walk reads a low-bit projection's device from its packed buffer (a `LowBitLinear` has no
    ``weight``): on a device where the kernels compile, the copy's attention is planned as `FusedQKVAttention`."""
    from hf_sparse_verify.integrations import switch
    from hf_sparse_verify.integrations.mlp import LowBitGatedMLP
    from hf_sparse_verify.integrations.qkv_attention import FusedQKVAttention

    copy = low_bit_copy(tiny_llama(layers=2), "int4", group_size=32)
    monkeypatch.setattr(switch, "compiled_on", lambda device: True)
    replacements = [
        swap[3] for swap in switch.plan_swaps(copy, switch.Mode(fused=True))
    ]  # (parent, name, old, new)
    fused = [r for r in replacements if isinstance(r, FusedQKVAttention)]
    assert len(fused) == 2 and all(r.low_bit and r._qkv is not None for r in fused)
    assert sum(isinstance(r, LowBitGatedMLP) for r in replacements) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="tinygemm runs on CUDA only")
def test_int4_copy_of_a_bf16_model_on_cuda_drafts_through_tinygemm():
    """On CUDA in bf16 the int4 copy's layers take PyTorch's tinygemm layout; its logits agree with the same values
    run through our layout (scales rounded to bf16 the only difference), and as a draft it is accepted about as often
    as the copy in our layout. (A head scaled up gives the random model clear top-1 margins, so acceptance measures
    the copy, not bf16 noise; output equality is tested in float32 elsewhere.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    model = model.to("cuda", torch.bfloat16)
    fast, ours = low_bit_copy(model, "int4", 64), low_bit_copy(model, "int4", 64, layout="packed")
    assert {m.layout for m in fast.modules() if isinstance(m, LowBitLinear)} == {"tinygemm"}
    assert {m.layout for m in ours.modules() if isinstance(m, LowBitLinear)} == {"packed"}
    ids = torch.randint(0, 256, (2, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        a, b = fast(ids).logits.float(), ours(ids).logits.float()
    assert float((a - b).abs().max() / b.abs().max()) < 0.05
    assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) > 0.9

    def acceptance(draft):
        out = model.generate(
            input_ids=ids, max_new_tokens=24, do_sample=False, custom_generate=hsv.generate, draft_model=draft,
            speculation=dict(strategy="draft_model", num_draft_tokens=4), return_dict_in_generate=True,
        )  # fmt: skip
        return out.speculation.mean_acceptance_length

    with_tinygemm, with_ours = acceptance(fast), acceptance(ours)
    assert with_tinygemm > 1.5 and with_tinygemm >= 0.8 * with_ours


def test_a_captured_draft_step_on_low_bit_weights_is_not_taken_for_the_models_own_step():
    """A step without slots serves every phase, unless draft steps run a low-bit copy: then a draft graph
    holds the copy's forward and a verify graph of the same width the model's."""
    from hf_sparse_verify.generation.engine.graphs import StepGraphs
    from hf_sparse_verify.step import Phase

    assert StepGraphs._key(Phase.DRAFT, 1, {}) == StepGraphs._key(Phase.VERIFY, 1, {})
    draft = StepGraphs._key(Phase.DRAFT, 1, {}, draft_weights=True)
    assert draft != StepGraphs._key(Phase.VERIFY, 1, {}, draft_weights=True)
    assert StepGraphs._key(Phase.VERIFY, 1, {}, draft_weights=True) == StepGraphs._key(Phase.VERIFY, 1, {})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused modules run on CUDA")
def test_stacked_low_bit_copy_on_cuda_computes_what_the_unstacked_one_does():
    """Switched in, the stacked int4 copy (q / k / v and gate / up each one tinygemm launch, through
    `FusedQKVAttention` and `LowBitGatedMLP`) gives the logits of the copy made without stacking."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_sparse_verify.integrations import Mode, speculation_mode

    config = LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval().to("cuda", torch.bfloat16)
    stacked, apart = low_bit_copy(model, "int4", 64), low_bit_copy(model, "int4", 64, stack=False)
    ids = torch.randint(0, 256, (2, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    with torch.no_grad():
        expected = apart(ids).logits.float()
        with speculation_mode(
            stacked, mode=Mode(attention=False, fused=True, fused_parts=frozenset({"attention", "mlp"}))
        ) as switched:
            assert (
                switched.counts.get("LowBitGatedMLP") == 2 and switched.counts.get("FusedQKVAttention") == 2
            )
            got = stacked(ids).logits.float()
    assert float((got - expected).abs().max() / expected.abs().max()) < 2e-2
    assert float((got.argmax(-1) == expected.argmax(-1)).float().mean()) > 0.9


def test_only_what_a_replacement_runs_together_is_stacked():
    """q / k / v of a replaceable attention and gate / up of a SiLU gated MLP are stacked; a GELU MLP's gate and up
    (which no replacement runs together) stay two layers."""
    copy = low_bit_copy(tiny_llama(hidden_act="gelu"), "int4", group_size=32)
    layer = copy.model.layers[0]
    assert low_bit.stacks(layer.self_attn) == [("q_proj", "k_proj", "v_proj")] and not low_bit.stacks(
        layer.mlp
    )
    assert isinstance(layer.self_attn.v_proj, LowBitRows) and isinstance(layer.mlp.up_proj, LowBitLinear)


def test_auto_draft_weights_take_the_copy_measured_faster_for_the_rows():
    """``draft_weights="auto"``: on CPU both copies run the packed layout, int4 measured faster than bf16 at one
    row only and int8 to 16 (`LowBitLinear.FASTER_ROWS`), so one row drafts on int4, two on int8, 17 on the model's
    own weights; output equals plain generate, and the statistics name the copy that drafted."""
    model = make_model("llama")
    assert [low_bit.draft_weights_for(model, "auto", 16, rows) for rows in (1, 2, 16, 17)] == [
        "int4", "int8", "int8", None
    ]
    assert low_bit.draft_weights_for(model, "int4", 16, 65) == "int4"  # a named format is kept, at any rows
    assert low_bit.draft_weights_for(model, "auto", 24, 1) == "int8"  # a group that does not divide: no int4
    for batch, expected in ((1, "int4"), (2, "int8")):
        ids = torch.randint(3, model.config.vocab_size, (batch, 40), generator=torch.Generator().manual_seed(2))
        ids[:, 20:] = ids[:, :20]
        plain = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
        out = model.generate(
            input_ids=ids, max_new_tokens=8, do_sample=False, custom_generate=hsv.generate,
            speculation=dict(strategy="vegas", num_draft_tokens=3, ratio=0.5, min_tokens=4, draft_weights="auto",
                             draft_weight_group=16),
            return_dict_in_generate=True,
        )  # fmt: skip
        assert torch.equal(out.sequences, plain)
        assert out.speculation.draft_weights == expected
        assert f"drafts on the model's {expected} copy" in out.speculation.summary()


def test_auto_draft_weights_of_the_low_bit_strategy_never_mean_the_model_itself(monkeypatch):
    """Where no copy is measured faster at the call's rows, ``"auto"`` means the model's own weights for Vegas, but the
    ``low_bit`` strategy's draft is the copy: it takes int8 (the copy whose kernel holds to the most rows)."""
    model = make_model("llama")
    monkeypatch.setattr(LowBitLinear, "FASTER_ROWS", dict.fromkeys(LowBitLinear.FASTER_ROWS, 1))
    ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    plain = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
    out = model.generate(
        input_ids=ids, max_new_tokens=6, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy="low_bit", num_draft_tokens=3, draft_weights="auto", draft_weight_group=16),
        return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, plain)
    assert [fmt for fmt, _ in low_bit._COPIES[model]] == ["int8"]
    assert out.speculation.draft_weights == "int8"
