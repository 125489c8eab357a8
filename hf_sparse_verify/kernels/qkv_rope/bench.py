"""Benchmark entries ``qkv_proj`` and ``rope_qk`` on the Llama-3.1-8B attention (hidden 4096, 32 query and 8 key /
value heads of 128) and the Qwen3-30B-A3B one (hidden 2048, 32 / 4 heads of 128, per-head q/k norms).

- ``qkv_proj``: the three projections of 1, 8 and 16 rows: ``triton`` (this folder's op) vs ``torch`` (three
  ``F.linear``, as transformers). ``bytes_moved``: the three weights plus activations.
- ``row_linear``: the output projection of the same rows, ``triton`` vs ``torch`` (``F.linear``).
- ``rope_qk``: norm + rotary of the same rows: ``triton`` vs ``torch`` (the reference, eager op by op).
  ``bytes_moved``: queries and keys in and out, cos / sin.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..bench_registry import KernelCase, register_benchmark
from .naive import qkv_proj_naive, rope_qk_naive
from .op import qkv_proj, rope_qk, row_linear

#: name -> (hidden, query heads, key/value heads, head dim, per-head q/k norms)
SHAPES = {"llama-3.1-8b": (4096, 32, 8, 128, False), "qwen3-30b-a3b": (2048, 32, 4, 128, True)}
QUICK = {"quick": (64, 4, 2, 16, True)}


@register_benchmark("qkv_proj")
def qkv_proj_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    for name, (hidden, heads_q, heads_kv, dim, _) in (QUICK if quick else SHAPES).items():
        gen = torch.Generator(device="cpu").manual_seed(0)
        weights = [
            (torch.randn(heads * dim, hidden, generator=gen) * 0.02).to(device, dtype)
            for heads in (heads_q, heads_kv, heads_kv)
        ]
        for rows in (1, 8, 16):
            x = torch.randn(rows, hidden, device=device, dtype=dtype)
            moved = (
                sum(w.numel() for w in weights) + rows * (hidden + (heads_q + 2 * heads_kv) * dim)
            ) * x.element_size()
            params = dict(shape=name, rows=rows, hidden=hidden)
            yield KernelCase("qkv_proj", "triton", params, moved, functools.partial(qkv_proj, x, *weights))
            yield KernelCase(
                "qkv_proj", "torch", params, moved, functools.partial(qkv_proj_naive, x, *weights)
            )


@register_benchmark("row_linear")
def row_linear_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    """The attention output projection ``[H_q * D] -> [hidden]``: ``triton`` vs ``torch`` (``F.linear``)."""
    for name, (hidden, heads_q, _, dim, _) in (QUICK if quick else SHAPES).items():
        w = (torch.randn(hidden, heads_q * dim, device=device) * 0.02).to(dtype)
        for rows in (1, 8, 16):
            x = torch.randn(rows, heads_q * dim, device=device, dtype=dtype)
            moved = (w.numel() + rows * (hidden + heads_q * dim)) * x.element_size()
            params = dict(shape=name, rows=rows, hidden=hidden)
            yield KernelCase("row_linear", "triton", params, moved, functools.partial(row_linear, x, w))
            yield KernelCase("row_linear", "torch", params, moved, functools.partial(F.linear, x, w))


@register_benchmark("rope_qk")
def rope_qk_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    for name, (_, heads_q, heads_kv, dim, norm) in (QUICK if quick else SHAPES).items():
        weights = [torch.ones(dim, device=device, dtype=dtype) if norm else None for _ in range(2)]
        for rows in (1, 8, 16):
            q = torch.randn(rows, heads_q * dim, device=device, dtype=dtype)
            k = torch.randn(rows, heads_kv * dim, device=device, dtype=dtype)
            cos, sin = (
                torch.randn(rows, dim, device=device, dtype=dtype),
                torch.randn(rows, dim, device=device, dtype=dtype),
            )
            moved = (2 * (q.numel() + k.numel()) + 2 * cos.numel()) * q.element_size()
            params = dict(shape=name, rows=rows, norm=norm)
            args = (q, k, cos, sin, dim, *weights)
            yield KernelCase("rope_qk", "triton", params, moved, functools.partial(rope_qk, *args))
            yield KernelCase("rope_qk", "torch", params, moved, functools.partial(rope_qk_naive, *args))
