"""Benchmark entry ``index_scores``: a DeepSeek-V3.2 indexer (64 heads x 128) scoring 1 and 8 new tokens over 16K
and 32K cached keys of one row, against the reference (transformers' arithmetic: float32 key copy, per-head
scores)."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import index_scores_naive
from .op import index_scores


@register_benchmark("index_scores")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads, dim = (4, 32) if quick else (64, 128)
    size = torch.empty((), dtype=dtype).element_size()
    for context in (256,) if quick else (16384, 32768):
        keys = torch.randn(1, context, dim, device=device, dtype=dtype)
        for tokens in (1, 8):
            q = torch.randn(1, tokens, heads, dim, device=device, dtype=dtype)
            w = torch.randn(1, tokens, heads, device=device)
            moved = context * dim * size + tokens * (heads * dim * size + heads * 4 + context * 4)
            params = dict(context=context, q_len=tokens, heads=heads, head_dim=dim)
            yield KernelCase("index_scores", "triton", params, moved,
                             functools.partial(index_scores, q, keys, w, dim**-0.5))  # fmt: skip
            yield KernelCase("index_scores", "reference", params, moved,
                             functools.partial(index_scores_naive, q, keys, w, dim**-0.5))  # fmt: skip
