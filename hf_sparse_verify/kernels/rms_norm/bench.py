"""Benchmark entry ``rms_norm``: the Llama-3.1-8B hidden size (4096) for decode/verify rows (1..16 tokens) and a
batch of 32 x 5, against the eager module arithmetic (``naive``)."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import rms_norm_gated_naive, rms_norm_naive
from .op import rms_norm, rms_norm_gated


@register_benchmark("rms_norm")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    hidden = 64 if quick else 4096
    size = torch.empty((), dtype=dtype).element_size()
    for rows in (1, 16, 160):
        x = torch.randn(rows, hidden, device=device, dtype=dtype)
        w = torch.rand(hidden, device=device, dtype=dtype)
        moved = (2 * rows + 1) * hidden * size
        params = dict(rows=rows, hidden=hidden)
        yield KernelCase("rms_norm", "triton", params, moved, functools.partial(rms_norm, x, w, 1e-5))
        yield KernelCase("rms_norm", "eager", params, moved, functools.partial(rms_norm_naive, x, w, 1e-5))


@register_benchmark("rms_norm_gated")
def gated_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    """The gated norm after Qwen3-Next's Gated DeltaNet recurrence: rows of its 128-wide value heads, 32 per token,
    for 1, 5 and 40 tokens, against the eager module arithmetic."""
    width = 16 if quick else 128
    size = torch.empty((), dtype=dtype).element_size()
    for tokens in (1, 5, 40):
        rows = tokens * (2 if quick else 32)
        x = torch.randn(rows, width, device=device, dtype=dtype)
        z = torch.randn(rows, width, device=device, dtype=dtype)
        w = torch.rand(width, device=device, dtype=dtype)
        moved = (3 * rows + 1) * width * size
        params = dict(rows=rows, hidden=width)
        yield KernelCase("rms_norm_gated", "triton", params, moved, functools.partial(rms_norm_gated, x, z, w, 1e-6))
        yield KernelCase("rms_norm_gated", "eager", params, moved,
                         functools.partial(rms_norm_gated_naive, x, z, w, 1e-6))  # fmt: skip
