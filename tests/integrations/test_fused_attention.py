"""FusedQKVAttention: the original arithmetic on CPU (bitwise), the fused kernels' path (Triton interpreter) within
rounding, the replacement's bookkeeping, and what it refuses."""

from __future__ import annotations

import contextlib

import pytest
import torch
from conftest import make_model

from hf_sparse_verify.integrations import FusedQKVAttention, Mode, speculation_mode
from hf_sparse_verify.integrations.qkv_attention import REPLACEABLE as FUSED_ATTENTION_REPLACEABLE
from hf_sparse_verify.integrations.qkv_attention import replaceable_attention
from hf_sparse_verify.kernels._triton import triton_runs_on

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral"]


@contextlib.contextmanager
def _replaced(model):
    swaps = [
        (parent, name, child)
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if replaceable_attention(child)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, FusedQKVAttention(child))
    try:
        yield len(swaps)
    finally:
        for parent, name, child in swaps:
            setattr(parent, name, child)


@pytest.mark.parametrize("arch", ARCHS)
def test_original_arithmetic_is_bitwise(arch):
    """Off CUDA the replacement runs transformers' arithmetic op by op: logits and greedy output are identical."""
    model = make_model(arch)
    ids = torch.randint(3, 90, (2, 11))
    expected = model(ids).logits
    plain = model.generate(ids, max_new_tokens=6, do_sample=False)
    with _replaced(model) as count:
        assert count == model.config.num_hidden_layers
        assert torch.equal(model(ids).logits, expected)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), plain)


@pytest.mark.skipif(not triton_runs_on(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("length", [3, 20])  # one launch for q/k/v (<= MAX_ROWS rows), and F.linear above it
def test_fused_path_matches(monkeypatch, arch, length):
    """The Triton path (interpreted on CPU) gives the original logits within float32 summation order, also in
    decode steps that extend a cache."""
    model = make_model(arch)
    ids = torch.randint(3, 90, (2, length))  # two rows: the model's own position ids give cos / sin [1, T, D]
    expected = model(ids).logits
    expected_next = model.generate(ids, max_new_tokens=4, do_sample=False)
    calls = []
    original_fused = FusedQKVAttention._project_fused

    def spy(self, *args):
        calls.append(args[0].shape[0])
        return original_fused(self, *args)

    monkeypatch.setattr(FusedQKVAttention, "_fused", lambda self, hidden, cos: True)
    monkeypatch.setattr(FusedQKVAttention, "_project_fused", spy)
    with _replaced(model):
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(model.generate(ids, max_new_tokens=4, do_sample=False), expected_next)
    assert 2 * length in calls and 2 in calls  # the prompt's rows and single decode rows both ran fused


def test_speculation_mode_leaves_cpu_attention():
    model = make_model("qwen3")
    with speculation_mode(model, mode=Mode(attention=False, fused=True)):
        assert not any(isinstance(m, FusedQKVAttention) for m in model.modules())


def test_refusals():
    olmoe = make_model("olmoe")  # q_norm / k_norm over all heads, not per head
    assert not any(replaceable_attention(m) for m in olmoe.modules())
    model = make_model("llama")
    attention = model.model.layers[0].self_attn
    assert replaceable_attention(attention) and type(attention).__name__ in FUSED_ATTENTION_REPLACEABLE
    attention.k_proj.bias = torch.nn.Parameter(torch.zeros(attention.k_proj.out_features))
    assert not replaceable_attention(attention)  # biases on some projections only
    with pytest.raises(ValueError, match="leave it in place"):
        FusedQKVAttention(attention)
    with pytest.raises(ValueError, match="leave it in place"):
        FusedQKVAttention(model.model.layers[0].mlp)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["prompt_lookup", "vegas"])
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_fast_path_equals_plain_generate(monkeypatch, arch, strategy):
    """On the GPU fast path (triton backend, CUDA graphs) the fused attention runs (counted) and float32 greedy
    output equals plain generate, for a ragged batch."""
    import hf_sparse_verify as hsv

    model = make_model(arch).cuda()
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 90, (2, 13), generator=gen).cuda()
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    calls = []
    original_fused = FusedQKVAttention._project_fused

    def spy(self, *args):
        calls.append(args[0].shape[0])
        return original_fused(self, *args)

    monkeypatch.setattr(FusedQKVAttention, "_project_fused", spy)
    common = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0)
    speculation = dict(attention_backend="triton", cuda_graphs=True, strategy=strategy, num_draft_tokens=3)
    if strategy == "vegas":
        speculation.update(ratio=0.3, min_tokens=4)
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(**common, custom_generate=hsv.generate, speculation=speculation)
    assert calls, "FusedQKVAttention never ran on the fast path"
    assert torch.equal(out, expected)
