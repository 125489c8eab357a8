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


@pytest.mark.parametrize("audio", ["as built", "unset"])
def test_each_part_of_a_composite_model_gets_its_own_attention_back(audio):
    """Gemma 4 with an audio encoder (the sizes of transformers' Gemma4 model tester): the text model runs SDPA, the
    audio model eager (it has no SDPA), or nothing set (Gemma 4 unified's tester). The call switches both and puts
    each one's own back; restoring one name for all failed on the audio model and left it on ours, so the next plain
    `generate` raised."""
    from transformers import Gemma4AudioConfig, Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig

    import hf_sparse_verify as hsv
    from hf_sparse_verify._compat import attention_implementations

    text = Gemma4TextConfig(
        vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, layer_types=["sliding_attention", "full_attention"], sliding_window=8,
        vocab_size_per_layer_input=99, hidden_size_per_layer_input=16, pad_token_id=0, eos_token_id=2, bos_token_id=1,
    )  # fmt: skip
    audio_sizes = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, subsampling_conv_channels=[16, 8],
        attention_chunk_size=4, attention_context_left=5, attention_context_right=0, output_proj_dims=32,
    )  # fmt: skip
    torch.manual_seed(0)
    parts = Gemma4Config(text_config=text, audio_config=Gemma4AudioConfig(**audio_sizes))
    model = Gemma4ForConditionalGeneration(parts).eval()
    if audio == "unset":
        model.config.audio_config._attn_implementation = None
    before = attention_implementations(model.config)
    assert before["text_config"] != before["audio_config"]  # the case: parts with different implementations
    ids = torch.randint(3, 99, (1, 12))
    plain = model.generate(ids, max_new_tokens=5, do_sample=False)
    for _ in range(2):
        out = model.generate(
            ids, max_new_tokens=5, do_sample=False, custom_generate=hsv.generate,
            speculation=dict(strategy="prompt_lookup"),
        )  # fmt: skip
        assert torch.equal(out, plain)
        assert attention_implementations(model.config) == before
    assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), plain)


def test_misuse_is_refused_with_what_to_change():
    model = make_model("llama")
    with pytest.raises(TypeError, match="mode=Mode"):
        with speculation_mode(model, Mode()):
            pass
    with pytest.raises(ValueError, match="unknown fused_parts \\['mlps'\\]; choose from"):
        Mode(fused=True, fused_parts=frozenset({"mlps"}))
