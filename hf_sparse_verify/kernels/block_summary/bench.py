"""Benchmark entry ``block_summary``: Llama-3.1-8B shape (32 query heads, 8 KV heads, head_dim 128), block 64.

Variants, each ``<mode>/<implementation>``:
- ``build/triton``, ``build/torch``: block means of the whole cache (prefill); torch = view + masked mean.
- ``update_q8/triton``: refresh after a verify step wrote 8 keys straddling a block boundary (2 blocks).
- ``score/triton``, ``score/torch``: one query row against every block of one layer; torch = einsum + mask.
- ``score_32layers/triton``, ``score_32layers/torch``: the same for 32 layers in one launch.
- ``select_n64/torch``: top-64 selection plus forced blocks from one layer's scores.
"""

from __future__ import annotations

import torch

from ..bench_registry import KernelCase, register_benchmark
from .kernel import launch_build, launch_score, launch_update
from .naive import num_blocks
from .op import select_top_blocks

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 64
LAYERS, Q_LEN, TOP_N = 32, 8, 64


def torch_build(keys, pad, length, block_size):
    """Plain-PyTorch block means (capacity a multiple of ``block_size``)."""
    batch, kv_heads, capacity, dim = keys.shape
    slot = torch.arange(capacity, device=keys.device)
    valid = ((slot >= pad[:, None]) & (slot < length[:, None])).view(batch, 1, -1, block_size, 1)
    blocks = keys.view(batch, kv_heads, -1, block_size, dim).float() * valid
    return blocks.sum(3) / valid.sum(3).clamp(min=1)


def torch_score(query, mean_key, pad, length, block_size, scale):
    """Plain-PyTorch block scores, ``[..., B, H, D]`` x ``[..., B, H_kv, n, D]``."""
    *lead, heads, dim = query.shape
    kv_heads, nblocks = mean_key.shape[-3], mean_key.shape[-2]
    summed = query.float().view(*lead, kv_heads, heads // kv_heads, dim).sum(-2)
    scores = torch.einsum("...hd,...hnd->...hn", summed, mean_key) * scale
    j = torch.arange(nblocks, device=query.device)
    valid = ((j + 1) * block_size > pad[:, None]) & (j * block_size < length[:, None])  # [B, n]
    return scores.masked_fill(~valid[:, None], float("-inf"))


@register_benchmark("block_summary")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads, kv_heads, dim = (4, 2, 64) if quick else (HEADS, KV_HEADS, HEAD_DIM)
    layers = 4 if quick else LAYERS
    for context in (4096,) if quick else (65536, 131072):
        yield from _context_cases(device, dtype, context, heads, kv_heads, dim, layers)


def _context_cases(device, dtype, context, heads, kv_heads, dim, layers):
    size = dtype.itemsize
    nblocks = num_blocks(context, BLOCK)
    params = dict(
        context=context, batch=1, heads=heads, kv_heads=kv_heads, head_dim=dim, block_size=BLOCK,
        blocks=nblocks,
    )  # fmt: skip
    keys = torch.randn(1, kv_heads, context, dim, device=device, dtype=dtype)
    # the verify step wrote 8 keys at slots start .. start + 7, straddling a block boundary
    start = (context - 1000) // BLOCK * BLOCK - Q_LEN // 2
    pad = torch.tensor([0], device=device)
    start_t = torch.tensor([start], device=device)
    length = start_t + Q_LEN
    mean_key = torch.empty(1, kv_heads, nblocks, dim, device=device)
    launch_build(keys, pad, length, BLOCK, mean_key)

    # build: read the valid keys, write every block mean
    build_bytes = kv_heads * ((start + Q_LEN) * dim * size + nblocks * dim * 4)
    yield KernelCase(
        "block_summary", "build/triton", params, build_bytes,
        lambda: launch_build(keys, pad, length, BLOCK, mean_key),
    )  # fmt: skip
    yield KernelCase(
        "block_summary", "build/torch", params, build_bytes,
        lambda: torch_build(keys, pad, length, BLOCK),
    )  # fmt: skip

    # update: read the valid keys of the 2 touched blocks, write their means
    first = start // BLOCK * BLOCK
    touched = -(-(start + Q_LEN - first) // BLOCK)
    update_bytes = kv_heads * ((start + Q_LEN - first) * dim * size + touched * dim * 4)
    yield KernelCase(
        "block_summary", "update_q8/triton", {**params, "q_len": Q_LEN, "blocks_touched": touched},
        update_bytes,
        lambda: launch_update(keys, mean_key, pad, start_t, Q_LEN, BLOCK),
    )  # fmt: skip

    # score: read the block means and the query, write the scores
    query = torch.randn(1, heads, dim, device=device, dtype=dtype)
    scores = torch.empty(1, 1, kv_heads, nblocks, device=device)
    score_bytes = kv_heads * nblocks * (dim + 1) * 4 + heads * dim * size
    scale = dim**-0.5
    launch_score(query[None], mean_key[None], pad, length, BLOCK, scale, scores)
    yield KernelCase(
        "block_summary", "score/triton", params, score_bytes,
        lambda: launch_score(query[None], mean_key[None], pad, length, BLOCK, scale, scores),
    )  # fmt: skip
    yield KernelCase(
        "block_summary", "score/torch", params, score_bytes,
        lambda: torch_score(query, mean_key, pad, length, BLOCK, scale),
    )  # fmt: skip

    layer_query = torch.randn(layers, 1, heads, dim, device=device, dtype=dtype)
    layer_mean = mean_key[None].expand(layers, -1, -1, -1, -1).contiguous()
    layer_scores = torch.empty(layers, 1, kv_heads, nblocks, device=device)
    yield KernelCase(
        "block_summary", f"score_{layers}layers/triton", {**params, "layers": layers}, layers * score_bytes,
        lambda: launch_score(layer_query, layer_mean, pad, length, BLOCK, scale, layer_scores),
    )  # fmt: skip
    yield KernelCase(
        "block_summary", f"score_{layers}layers/torch", {**params, "layers": layers}, layers * score_bytes,
        lambda: torch_score(layer_query, layer_mean, pad, length, BLOCK, scale),
    )  # fmt: skip

    # select: read the scores, write the index and counts
    one_scores = scores[0]
    width = min(nblocks, TOP_N + 1 + 2)
    select_bytes = kv_heads * (nblocks * 4 + width * 4 + 4)
    yield KernelCase(
        "block_summary", f"select_n{TOP_N}/torch", {**params, "n": TOP_N, "q_len": Q_LEN}, select_bytes,
        lambda: select_top_blocks(one_scores, TOP_N, start_t, pad, Q_LEN, BLOCK),
    )  # fmt: skip
