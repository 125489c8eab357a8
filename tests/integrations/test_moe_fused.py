"""The ``"hsv_fused"`` experts implementation on tiny random MoE models (Triton interpreted on CPU): the same logits
as each model's own eager experts, greedy ``hf_sparse_verify.generate`` through it equal to plain ``generate``,
the modules it declines, and which implementation `Switched.decoding_experts` picks where."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import VOCAB, decoding_experts, ragged_batch
from moe_models import MOE_ARCHS, make_moe, needs_triton

import hf_sparse_verify as hsv
from hf_sparse_verify.integrations import (
    FUSED_EXPERTS,
    experts,
    fused_experts_forward,
    supports,
)


@needs_triton
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_same_logits_as_eager_experts(launches, arch):
    model = make_moe(arch)
    assert all(supports(m) for m in model.modules() if hasattr(m, "gate_up_proj"))
    ids = torch.randint(3, VOCAB, (2, 7))
    model.set_experts_implementation("eager")
    with torch.no_grad():
        expected = model(ids).logits
    model.set_experts_implementation("grouped_mm")
    with decoding_experts(model, use_fused=True), torch.no_grad():
        assert model.get_experts_implementation() == {"": FUSED_EXPERTS}
        logits = model(ids).logits
    assert model.get_experts_implementation() == {"": "grouped_mm"}
    assert launches == [14] * model.config.num_hidden_layers
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])  # routed only / with a shared expert
def test_greedy_generate_through_fused_experts_equals_plain(monkeypatch, launches, arch):
    """The engine's decode and verify steps on the fused experts (forced on CPU): plain greedy output."""
    monkeypatch.setattr(experts, "decoding_implementation", lambda device, use_fused=None: FUSED_EXPERTS)
    model = make_moe(arch)
    ids, mask = ragged_batch(2)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy="prompt_lookup", num_draft_tokens=4),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert launches and max(launches) <= 2 * 5  # decode / verify steps only (the prefill keeps grouped_mm)
    assert model.get_experts_implementation() == {"": "grouped_mm"}


def test_declined_modules_fall_back_to_batched_mm():
    experts_module = make_moe("qwen3_moe").model.layers[0].mlp.experts
    x, index = torch.randn(3, 64), torch.tensor([[0, 1], [2, 3], [1, 2]])
    weights = torch.rand(3, 2)
    expected = fused_experts_forward(experts_module, x, index, weights)
    for name, value in [("has_bias", True), ("act_fn", torch.nn.GELU()), ("is_concatenated", False)]:
        declined = copy.deepcopy(experts_module)
        setattr(declined, name, value)
        assert not supports(declined), name
    declined = copy.deepcopy(experts_module)
    declined.has_post_expert_norm = True
    declined.post_expert_norm = torch.nn.Identity()
    assert not supports(declined)
    fallback = fused_experts_forward(declined, x, index, weights)  # batched_mm on the same weights
    torch.testing.assert_close(fallback, expected, rtol=1e-5, atol=1e-5)


def test_decoding_implementation_by_device(monkeypatch):
    monkeypatch.setattr(experts, "triton_runs_on", lambda device: True)
    assert experts.decoding_implementation(torch.device("cuda")) == FUSED_EXPERTS
    monkeypatch.setattr(experts, "FUSED_BY_DEFAULT", False)
    assert experts.decoding_implementation(torch.device("cuda")) == "batched_mm"
    monkeypatch.setattr(experts, "FUSED_BY_DEFAULT", True)
    assert experts.decoding_implementation(torch.device("cuda"), use_fused=False) == "batched_mm"
    assert experts.decoding_implementation(torch.device("cpu")) is None
    assert experts.decoding_implementation(torch.device("cpu"), use_fused=True) == FUSED_EXPERTS
    monkeypatch.setattr(experts, "triton_runs_on", lambda device: False)
    assert experts.decoding_implementation(torch.device("cuda")) == "batched_mm"


def test_user_choices_and_cpu_default_are_kept():
    model = make_moe("olmoe")
    with decoding_experts(model):  # CPU: unchanged by default
        assert model.get_experts_implementation() == {"": "grouped_mm"}
    model.set_experts_implementation("batched_mm")
    with decoding_experts(model, use_fused=True):  # an explicit batched_mm is kept
        assert model.get_experts_implementation() == {"": "batched_mm"}
    model.set_experts_implementation(
        "eager"
    )  # transformers' fallback default where grouped_mm cannot dispatch
    with decoding_experts(model, use_fused=True):
        assert model.get_experts_implementation() == {"": FUSED_EXPERTS}
    model = make_moe("mixtral")
    with pytest.raises(RuntimeError), decoding_experts(model, use_fused=True):
        assert model.get_experts_implementation() == {"": FUSED_EXPERTS}
        raise RuntimeError("restored on errors too")
    assert model.get_experts_implementation() == {"": "grouped_mm"}
