"""Benchmark entry ``gated_delta``: one Gated DeltaNet layer's recurrence over a verify window of the Qwen3-Next-80B
shapes (16 key heads, 32 value heads, 128 x 128 float32 state per head) for 1 and 8 rows and windows of 1 and 5
tokens, on a ring of 32 states per row as the cache keeps them: the kernel writing the state after every token
(``triton``, what verify steps run), the kernel writing only the last token's (``triton_last_state``: the least an
exact recurrence writes, so the difference is what keeping every token's state costs), and the reference (a token
at a time)."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import gated_delta_ring_naive
from .op import gated_delta_ring

RING = 32


@register_benchmark("gated_delta")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads_k, heads_v, dim = (2, 4, 16) if quick else (16, 32, 128)
    for rows in (1, 8):
        for width in (1, 5):
            q, k = (torch.randn(rows, width, heads_k, dim, device=device, dtype=dtype) for _ in range(2))
            v = torch.randn(rows, width, heads_v, dim, device=device, dtype=dtype)
            g = -torch.rand(rows, width, heads_v, device=device)
            beta = torch.rand(rows, width, heads_v, device=device, dtype=dtype)
            ring = torch.zeros(rows, RING, heads_v, dim, dim, device=device)
            start = torch.randint(0, RING, (rows,), device=device)
            state_bytes = rows * heads_v * dim * dim * 4
            inputs = (2 * heads_k + 2 * heads_v) * rows * width * dim * q.element_size()
            params = dict(rows=rows, width=width, heads_v=heads_v, dim=dim)
            args = (q, k, v, g, beta, ring, start)
            every = state_bytes * (1 + width) + inputs
            yield KernelCase("gated_delta", "triton", params, every, functools.partial(gated_delta_ring, *args))
            yield KernelCase("gated_delta", "triton_last_state", params, state_bytes * 2 + inputs,
                             functools.partial(gated_delta_ring, *args, every_state=False))  # fmt: skip
            yield KernelCase("gated_delta", "reference", params, every,
                             functools.partial(gated_delta_ring_naive, *args))  # fmt: skip
