"""Benchmark entry ``decode_attention``: Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head_dim 128),
batch 1, 1..16 new tokens over a 64K or 128K cache.

Variants: ``triton`` (this folder's kernel), ``triton+scores`` (with Vegas Collect-2-Query score output) and
``sdpa`` (``F.scaled_dot_product_attention`` as transformers calls it: no mask for one token, a boolean causal mask
for several).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..bench_registry import KernelCase, register_benchmark
from .naive import attention_mask
from .op import decode_attention

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def _sdpa(query, key, value, mask, scale):
    if mask is None:
        return F.scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=True)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale, enable_gqa=True)


def _with_tiles(block_n: int, stages: int, *args):
    from . import kernel

    saved = dict(kernel.TILES)
    kernel.TILES.update(block_n=block_n, num_stages=stages)
    try:
        return decode_attention(*args)
    finally:
        kernel.TILES.update(saved)


def _scores_by_row_reduction(*args):
    from . import kernel

    kernel.SCORE_DOT_ROWS = False
    try:
        return decode_attention(*args, collect="two_rows")
    finally:
        kernel.SCORE_DOT_ROWS = True


@register_benchmark("decode_attention")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads, kv_heads, dim = (4, 2, 64) if quick else (HEADS, KV_HEADS, HEAD_DIM)
    contexts = (1024,) if quick else (65536, 131072)
    size = torch.empty((), dtype=dtype).element_size()
    for context in contexts:
        gen = torch.Generator(device="cpu").manual_seed(context)
        key = torch.randn(1, kv_heads, context, dim, generator=gen).to(device, dtype)
        value = torch.randn(1, kv_heads, context, dim, generator=gen).to(device, dtype)
        for q_len in (1, 2, 4, 8, 16):
            query = torch.randn(1, heads, q_len, dim, generator=gen).to(device, dtype)
            start = torch.tensor([context - q_len], device=device)
            pad = torch.zeros(1, dtype=torch.long, device=device)
            scale = dim**-0.5
            bytes_moved = 2 * key.numel() * size + 2 * query.numel() * size
            params = dict(context=context, q_len=q_len, batch=1, heads=heads, kv_heads=kv_heads, head_dim=dim)
            args = (query, key, value, start, pad, scale)
            yield KernelCase(
                "decode_attention", "triton", params, bytes_moved, functools.partial(decode_attention, *args)
            )
            yield KernelCase(
                "decode_attention", "triton+scores", params, bytes_moved + 4 * context,
                functools.partial(decode_attention, *args, collect="two_rows"),
            )  # fmt: skip
            if q_len >= 8:
                yield KernelCase(
                    "decode_attention", "triton+scores_rowsum", params, bytes_moved + 4 * context,
                    functools.partial(_scores_by_row_reduction, *args),
                )  # fmt: skip
            for block_n, stages in ((32, 3), (128, 2), (64, 4)):
                yield KernelCase(
                    "decode_attention", f"triton_n{block_n}_s{stages}", params, bytes_moved,
                    functools.partial(_with_tiles, block_n, stages, *args),
                )  # fmt: skip
            mask = None if q_len == 1 else attention_mask(start, pad, q_len, context)[:, None]
            yield KernelCase(
                "decode_attention",
                "sdpa",
                params,
                bytes_moved,
                functools.partial(_sdpa, query, key, value, mask, scale),
            )
