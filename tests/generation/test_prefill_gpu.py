"""Chunked prefill in half precision: every chunk after the first attends causally to all slots before it (a
lower-right causal mask), which the reference attention runs as SDPA flash attention with grouped KV heads read in
place instead of a boolean ``[B, 1, q, L]`` mask over repeated heads; left-padded batches one row at a time over
each row's real slots. Same result as the masked path and as an explicit float32 softmax; flash attention really
runs it. The GPU tests are skipped without a CUDA GPU (the host-side conditions and masks are tested on CPU)."""

from __future__ import annotations

import types

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from hf_sparse_verify.attention import eager as reference
from hf_sparse_verify.attention.eager import reference_attention
from hf_sparse_verify.step import Phase, ScoreCollection, StepContext
from hf_sparse_verify.step.context import DeviceView

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _view(batch: int, q_len: int, kv_len: int, device, *, pads=None, uniform_start=True) -> DeviceView:
    """A prefill chunk of ``q_len`` tokens per row ending at ``kv_len``, rows left-padded by ``pads``."""
    pads = pads or [0] * batch
    start = torch.full((batch,), kv_len - q_len, dtype=torch.long, device=device)
    step = StepContext(
        Phase.PREFILL, start, torch.tensor(pads, device=device), q_len=q_len, kv_len=kv_len,
        no_padding=max(pads) == 0, uniform_start=uniform_start, host_pad=tuple(pads),
    )  # fmt: skip
    return DeviceView(step, device)


def test_chunk_causal_conditions():
    """Only chunks of a prefill with one start for every row, on full-attention layers; unpadded for the one-call
    path, padded (with the host's pads) for the per-row one."""
    cpu = torch.device("cpu")
    assert _view(2, 16, 48, cpu).is_chunk_causal(None)
    assert _view(2, 16, 16, cpu).is_chunk_causal(None)  # the first chunk is the plain causal case too
    assert not _view(2, 16, 48, cpu).is_chunk_causal(8)
    assert not _view(2, 16, 48, cpu, pads=[0, 3]).is_chunk_causal(None)
    assert not _view(2, 16, 48, cpu, uniform_start=False).is_chunk_causal(None)
    assert reference._is_padded_chunk(_view(2, 16, 48, cpu, pads=[0, 3]), None)
    assert not reference._is_padded_chunk(_view(2, 16, 48, cpu, pads=[0, 3]), 8)
    assert not reference._is_padded_chunk(_view(2, 16, 48, cpu), None)
    assert not reference._is_padded_chunk(_view(2, 16, 48, cpu, pads=[0, 3], uniform_start=False), None)


def test_last_rows_mask_is_the_masks_last_rows():
    """Vegas' prefill seed reads the last rows of the chunk's mask; built alone, padded rows included."""
    cpu = torch.device("cpu")
    collection = ScoreCollection("two_rows", weights=True)
    rows = collection.PREFILL_SEED_ROWS
    for pads in ([0, 0, 0], [0, 7, 40], [45, 48, 3]):
        view = _view(3, 16, 48, cpu, pads=pads)
        assert torch.equal(reference._last_rows_mask(view, collection), view.mask(None)[:, :, -rows:])


def _explicit(query, key, value, q_len, kv_len, scaling, pads):
    """Float32 softmax attention of the chunk's rows (slot ``kv_len - q_len + i``) over slots ``pad <= j <= own``
    (a padding query over its own slot only)."""
    group = query.shape[1] // key.shape[1]
    k = key[:, :, :kv_len].float().repeat_interleave(group, dim=1)
    v = value[:, :, :kv_len].float().repeat_interleave(group, dim=1)
    logits = query.float() @ k.transpose(-1, -2) * scaling
    slots = torch.arange(kv_len, device=query.device)
    own = torch.arange(kv_len - q_len, kv_len, device=query.device)[:, None]
    pad = torch.tensor(pads, device=query.device)[:, None, None, None]
    allowed = ((slots <= own) & (slots >= pad)) | (slots == own)
    return (logits.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(1, 2)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "q_len, kv_len, pads",
    [
        (96, 96, None),
        (64, 300, None),
        (128, 517, None),
        (96, 96, [0, 30]),  # a padded first chunk
        (64, 300, [250, 300]),  # a later chunk: one row partly padding, one wholly
        (64, 300, [299, 0]),  # one real query row
    ],
)
def test_chunk_prefill_runs_flash_and_matches_the_mask(monkeypatch, dtype, q_len, kv_len, pads):
    device = torch.device("cuda")
    gen = torch.Generator(device).manual_seed(0)
    batch, heads, kv_heads, dim, capacity = 2, 8, 2, 64, 600
    pads = pads or [0] * batch
    query = torch.randn(batch, heads, q_len, dim, device=device, dtype=dtype, generator=gen)
    key = torch.randn(batch, kv_heads, capacity, dim, device=device, dtype=dtype, generator=gen)
    value = torch.randn(batch, kv_heads, capacity, dim, device=device, dtype=dtype, generator=gen)
    module = types.SimpleNamespace(layer_idx=0)
    scaling = dim**-0.5
    view = _view(batch, q_len, kv_len, device, pads=pads)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # fails if SDPA cannot take it as flash attention
        fast = reference_attention(module, query, key, value, view, scaling=scaling)
    monkeypatch.setattr(DeviceView, "is_chunk_causal", lambda self, window: False)
    monkeypatch.setattr(reference, "_is_padded_chunk", lambda view, window: False)
    masked = reference_attention(
        module, query, key, value, _view(batch, q_len, kv_len, device, pads=pads), scaling=scaling
    )
    exact = _explicit(query, key, value, q_len, kv_len, scaling, pads)
    assert fast.shape == masked.shape == (batch, q_len, heads, dim)
    tol = 2e-2 if dtype is torch.bfloat16 else 4e-3
    torch.testing.assert_close(fast.float(), exact, atol=tol, rtol=0)
    torch.testing.assert_close(masked.float(), exact, atol=tol, rtol=0)
