"""`speculation_mode`, the one switch: one walk of the module tree per model, every change undone on exit (also on
errors), clear errors for a misused call."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from hf_sparse_verify.attention import NAME
from hf_sparse_verify.integrations import Mode, plan_swaps, speculation_mode


def test_plan_walks_each_module_once(monkeypatch):
    model = make_model("qwen3_moe")
    seen: list[int] = []
    original = torch.nn.Module.named_children

    def counting(self, *args, **kwargs):
        seen.append(id(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_children", counting)
    plan_swaps(model, Mode(fused=True, sparse_ffn=True, expert_skipping=True))
    # one walk: a module's children are listed once per place it hangs in the tree (a module shared by two parents,
    # as the tiny Qwen3-MoE's router is, twice); the five walks of round 2 listed every module's five times
    places = sum(1 for _ in model.named_modules(remove_duplicate=False))
    assert 0 < len(seen) <= places


def test_everything_is_restored_also_after_an_error():
    model = make_model("llama")
    before = {name: type(m) for name, m in model.named_modules()}
    implementation = model.config._attn_implementation
    with (
        pytest.raises(RuntimeError, match="inside"),
        speculation_mode(model, mode=Mode(sparse_ffn=True)) as switched,
    ):
        assert switched.counts == {"GatedMLP": model.config.num_hidden_layers}
        assert model.config._attn_implementation == NAME
        raise RuntimeError("inside")
    assert {name: type(m) for name, m in model.named_modules()} == before
    assert model.config._attn_implementation == implementation


def test_misuse_is_refused_with_what_to_change():
    model = make_model("llama")
    with pytest.raises(TypeError, match="mode=Mode"):
        with speculation_mode(model, Mode()):
            pass
    with pytest.raises(ValueError, match="unknown fused_parts \\['mlps'\\]; choose from"):
        Mode(fused=True, fused_parts=frozenset({"mlps"}))
