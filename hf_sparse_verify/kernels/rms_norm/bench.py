"""Benchmark entry ``rms_norm``: the Llama-3.1-8B hidden size (4096) for decode/verify rows (1..16 tokens) and a
batch of 32 x 5, against the eager module arithmetic (``naive``)."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import rms_norm_naive
from .op import rms_norm


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
