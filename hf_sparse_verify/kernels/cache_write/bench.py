"""Benchmark entry ``cache_write``: one layer's new keys and values (8 KV heads x 128, bf16) for 1 and 16 new
tokens into a 64K cache, against the two eager scatters."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import cache_write_naive
from .op import cache_write


@register_benchmark("cache_write")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    kv_heads, dim, capacity = (2, 64, 1024) if quick else (8, 128, 65536)
    size = torch.empty((), dtype=dtype).element_size()
    kc = torch.randn(1, kv_heads, capacity, dim, device=device, dtype=dtype)
    vc = torch.randn_like(kc)
    for q_len in (1, 16):
        key = torch.randn(1, q_len, kv_heads, dim, device=device, dtype=dtype).transpose(
            1, 2
        )  # as transformers
        value = torch.randn_like(key)
        slots = torch.arange(capacity - q_len, capacity, device=device)[None]
        moved = 4 * key.numel() * size
        params = dict(q_len=q_len, kv_heads=kv_heads, head_dim=dim, capacity=capacity)
        args = (kc, vc, key, value, slots)
        yield KernelCase("cache_write", "triton", params, moved, functools.partial(cache_write, *args))
        yield KernelCase("cache_write", "scatter", params, moved, functools.partial(cache_write_naive, *args))
