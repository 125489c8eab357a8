"""Chunked prefill of unpadded prompts in half precision: every chunk after the first attends causally to all slots
before it (a lower-right causal mask), which the reference attention runs as SDPA flash attention with grouped KV
heads read in place instead of a boolean ``[B, 1, q, L]`` mask over repeated heads. Same result as the masked path
and as an explicit float32 softmax; flash attention really runs it. Skipped without a CUDA GPU (the host-side
conditions are tested on CPU)."""

from __future__ import annotations

import types

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_sparse_verify.attention.reference import reference_attention
from hf_sparse_verify.step import Phase, StepContext
from hf_sparse_verify.step.context import DeviceView

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _view(batch: int, q_len: int, kv_len: int, device, *, no_padding=True, uniform_start=True) -> DeviceView:
    start = torch.full((batch,), kv_len - q_len, dtype=torch.long, device=device)
    pad = torch.zeros(batch, dtype=torch.long, device=device)
    step = StepContext(
        Phase.PREFILL,
        start,
        pad,
        q_len=q_len,
        kv_len=kv_len,
        no_padding=no_padding,
        uniform_start=uniform_start,
    )
    return DeviceView(step, device)


def test_chunk_causal_conditions():
    """Only later chunks of an unpadded prefill with one start for every row, on full-attention layers."""
    cpu = torch.device("cpu")
    assert _view(2, 16, 48, cpu).is_chunk_causal(None)
    assert _view(2, 16, 16, cpu).is_chunk_causal(None)  # the first chunk is the plain causal case too
    assert not _view(2, 16, 48, cpu).is_chunk_causal(8)
    assert not _view(2, 16, 48, cpu, no_padding=False).is_chunk_causal(None)
    assert not _view(2, 16, 48, cpu, uniform_start=False).is_chunk_causal(None)


def _explicit(query, key, value, q_len, kv_len, scaling):
    """Float32 softmax attention of the chunk's rows (slot ``kv_len - q_len + i``) over slots ``<=`` their own."""
    group = query.shape[1] // key.shape[1]
    k = key[:, :, :kv_len].float().repeat_interleave(group, dim=1)
    v = value[:, :, :kv_len].float().repeat_interleave(group, dim=1)
    logits = query.float() @ k.transpose(-1, -2) * scaling
    own = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
    logits = logits.masked_fill(torch.arange(kv_len, device=query.device)[None, :] > own, float("-inf"))
    return (logits.softmax(-1) @ v).transpose(1, 2)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len, kv_len", [(96, 96), (64, 300), (128, 517)])
def test_chunk_prefill_runs_flash_and_matches_the_mask(monkeypatch, dtype, q_len, kv_len):
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    batch, heads, kv_heads, dim, capacity = 2, 8, 2, 64, 600
    query = torch.randn(batch, heads, q_len, dim, device=device, dtype=dtype, generator=gen)
    key = torch.randn(batch, kv_heads, capacity, dim, device=device, dtype=dtype, generator=gen)
    value = torch.randn(batch, kv_heads, capacity, dim, device=device, dtype=dtype, generator=gen)
    module = types.SimpleNamespace(layer_idx=0)
    scaling = dim**-0.5
    view = _view(batch, q_len, kv_len, device)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # fails if SDPA cannot take it as flash attention
        fast = reference_attention(module, query, key, value, view, scaling=scaling)
    monkeypatch.setattr(DeviceView, "is_chunk_causal", lambda self, window: False)
    masked = reference_attention(
        module, query, key, value, _view(batch, q_len, kv_len, device), scaling=scaling
    )
    exact = _explicit(query, key, value, q_len, kv_len, scaling)
    assert fast.shape == masked.shape == (batch, q_len, heads, dim)
    tol = 2e-2 if dtype is torch.bfloat16 else 4e-3
    torch.testing.assert_close(fast.float(), exact, atol=tol, rtol=0)
    torch.testing.assert_close(masked.float(), exact, atol=tol, rtol=0)
