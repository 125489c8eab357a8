"""`FusedDecoderLayer` against the transformers decoder layer it stands in for: the same output for the arguments the
model passes (bitwise on the reference paths, within float32 summation order with the kernels interpreted), the
residual handed to the fused experts, whole models with the layers swapped, and which layers it refuses."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, make_model
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import hf_sparse_verify.kernels.fused_experts.op as experts_op
import hf_sparse_verify.kernels.rms_norm.op as norm_op
from hf_sparse_verify._compat import decoder_layers
from hf_sparse_verify.integrations import FusedDecoderLayer, Mode, replaceable_decoder_layer, speculation_mode
from hf_sparse_verify.integrations import fused_experts as fused
from hf_sparse_verify.integrations.decoder_layer import REPLACEABLE as DECODER_LAYER_REPLACEABLE

MOE = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")


def _model(arch: str) -> torch.nn.Module:
    if arch != "qwen2_moe":
        return make_model(arch)
    config = Qwen2MoeConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=512, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2MoeForCausalLM(config).eval()


def _layer_calls(model, ids) -> list[tuple[tuple, dict]]:
    """The positional and keyword arguments each decoder layer gets in ``model(ids)`` (no cache)."""
    calls, handles = [], []
    for layer in decoder_layers(model):
        handles.append(
            layer.register_forward_pre_hook(lambda m, a, k: calls.append((a, dict(k))), with_kwargs=True)
        )
    try:
        model(ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return calls


@pytest.fixture
def reference_ops(monkeypatch):
    """The ops' plain PyTorch references instead of the (interpreted) kernels: bitwise comparisons."""
    monkeypatch.setattr(norm_op, "triton_runs_on", lambda device: False)
    monkeypatch.setattr(experts_op, "triton_runs_on", lambda device: False)


def _use_fused_experts(model) -> None:
    fused.register()
    fused.record_layers(model)
    model.set_experts_implementation(fused.NAME)


@pytest.mark.parametrize("arch", [*ARCHITECTURES, "qwen2_moe"])
@pytest.mark.parametrize("experts", ["model", "hsv_fused"])
def test_layer_equals_original_bitwise(reference_ops, arch, experts):
    if experts == "hsv_fused" and arch not in MOE:
        pytest.skip("dense model")
    model = _model(arch)
    if experts == "hsv_fused":
        _use_fused_experts(model)
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(1))
    layers = decoder_layers(model)
    assert all(type(layer).__name__ in DECODER_LAYER_REPLACEABLE for layer in layers)
    with torch.no_grad():
        for layer, (args, kwargs) in zip(layers, _layer_calls(model, ids)):
            ours = FusedDecoderLayer(layer)
            takes = ours._experts_take_residual()
            assert takes == (experts == "hsv_fused" and arch != "qwen2_moe")  # a shared expert keeps the add
            assert torch.equal(ours(*args, **kwargs), layer(*args, **kwargs))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe"])
def test_layer_with_interpreted_kernels(arch):
    """The Triton add + norm and the experts with their residual (interpreted on CPU, float32): equal to the
    original within summation order."""
    model = _model(arch)
    if arch in MOE:
        _use_fused_experts(model)
    ids = torch.randint(3, 90, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for layer, (args, kwargs) in zip(decoder_layers(model), _layer_calls(model, ids)):
            out = FusedDecoderLayer(layer)(*args, **kwargs)
            torch.testing.assert_close(out, layer(*args, **kwargs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "qwen2_moe"])
def test_whole_model_with_swapped_layers(reference_ops, arch):
    """Every layer swapped: the same logits (with a cache, prefill then decode) and the same greedy tokens."""
    model = _model(arch)
    if arch in MOE:
        _use_fused_experts(model)
    ids = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        expected_logits = model(ids).logits
        layers = decoder_layers(model)
        originals = list(layers)
        for i, layer in enumerate(originals):
            layers[i] = FusedDecoderLayer(layer)
        try:
            assert torch.equal(model(ids).logits, expected_logits)
            assert torch.equal(
                model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0), expected
            )
            # linked (as `speculation_mode` links consecutive layers on one device): a dense MLP's last add computes
            # the next layer's input RMSNorm, which that layer then does not run; the same logits and tokens
            for first, second in zip(list(layers), list(layers)[1:]):
                first.link(second)
            calls = []
            hooks = [layer.input_layernorm.register_forward_hook(lambda *_: calls.append(1)) for layer in layers]
            try:
                assert torch.equal(model(ids).logits, expected_logits)
            finally:
                for hook in hooks:
                    hook.remove()
            # the first layer normalizes its input itself; so does every layer after one whose experts add the
            # residual in their own launch (Qwen3-MoE's); Qwen2-MoE's shared expert keeps a torch add: handed over
            normalizing = 1 + sum(layer._experts_take_residual() for layer in list(layers)[:-1])
            assert len(calls) == normalizing and (normalizing == 1) == (arch in ("llama", "qwen2_moe")), calls
            assert torch.equal(
                model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0), expected
            )
        finally:
            for i, layer in enumerate(originals):
                layers[i] = layer


def test_hooked_experts_keep_their_hooks(reference_ops):
    """Hooks on the experts (RouterStats' calibration records routing weights so) still run: the layer then calls
    the MoE block as the original does and adds the residual itself."""
    model = _model("qwen3_moe")
    _use_fused_experts(model)
    ids = torch.randint(3, 90, (1, 7), generator=torch.Generator().manual_seed(4))
    layer = decoder_layers(model)[0]
    (args, kwargs), _ = _layer_calls(model, ids)
    seen = []
    handle = layer.mlp.experts.register_forward_pre_hook(lambda m, a: seen.append(a[2].shape))
    try:
        ours = FusedDecoderLayer(layer)
        assert not ours._experts_take_residual()
        with torch.no_grad():
            assert torch.equal(ours(*args, **kwargs), layer(*args, **kwargs))
        assert len(seen) == 2  # once for ours, once for the original
    finally:
        handle.remove()
    assert FusedDecoderLayer(layer)._experts_take_residual()


def test_refused_layers():
    model = make_model("llama")
    layer = decoder_layers(model)[0]
    assert replaceable_decoder_layer(layer)
    layer.mlp._hf_hook = object()  # accelerate's hook anywhere below the layer: it would be skipped
    assert not replaceable_decoder_layer(layer)
    with pytest.raises(ValueError, match="leave it in place"):
        FusedDecoderLayer(layer)
    del layer.mlp._hf_hook
    layer.input_layernorm = torch.nn.LayerNorm(64)  # not a Llama-family RMSNorm
    assert not replaceable_decoder_layer(layer)
    assert not replaceable_decoder_layer(model.model.norm)


def test_speculation_mode_links_consecutive_layers_of_one_device(reference_ops, monkeypatch):
    """Where decoder layers are replaced (forced here on the CPU, the ops on their references), each one hands its
    last residual add's RMSNorm to the next; the last layer links none; the model's logits stay bitwise."""
    from hf_sparse_verify.integrations import switch

    monkeypatch.setattr(switch, "compiled_on", lambda device: True)
    model = _model("llama")
    ids = torch.randint(3, 90, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(ids).logits
        with speculation_mode(model, mode=Mode(attention=False, fused=True, fused_parts=frozenset({"decoder_layer"}))):
            layers = list(decoder_layers(model))
            assert all(isinstance(layer, FusedDecoderLayer) for layer in layers) and len(layers) >= 2
            assert [layer._next for layer in layers] == [[b] for b in layers[1:]] + [[]]
            assert torch.equal(model(ids).logits, expected)
    assert not any(isinstance(m, FusedDecoderLayer) for m in model.modules())  # undone on exit


def test_not_swapped_off_cuda():
    """`speculation_mode` replaces decoder layers only where the kernels are compiled (CUDA)."""
    model = make_model("qwen3_moe")
    with speculation_mode(model, mode=Mode(attention=False, fused=True)):
        assert not any(isinstance(m, FusedDecoderLayer) for m in model.modules())
