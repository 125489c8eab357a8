"""Benchmark entry ``token_sparse``: Llama-3.1-8B attention shape, 7% of the prefix selected, 16 recent slots.

Variants: ``triton`` (this folder's kernel) and ``gather_sdpa`` (the plain-PyTorch path of
``hf_sparse_verify.attention.token_sparse``: gather the selected K/V, concatenate the recent slots, masked SDPA).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..bench_registry import KernelCase, register_benchmark
from .kernel import token_sparse_attention_triton

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
RATIO = 0.07
RECENT = 16


def gather_sdpa(query, key, value, index, index_valid, recent_lo, kv_len, recent_start, start, scale):
    """The gather + SDPA draft path; ``recent_lo = min(recent_start)`` and ``kv_len`` are host ints."""
    batch, kv_heads, _, dim = key.shape
    q_len = query.shape[2]
    gather_index = index[:, None, :, None].expand(batch, kv_heads, index.shape[1], dim)
    keys = torch.cat([key.gather(2, gather_index), key[:, :, recent_lo:kv_len]], dim=2)
    values = torch.cat([value.gather(2, gather_index), value[:, :, recent_lo:kv_len]], dim=2)
    recent_slots = torch.arange(recent_lo, kv_len, device=query.device)
    query_slots = start[:, None] + torch.arange(q_len, device=query.device)  # [B, q]
    recent_ok = (recent_slots[None, None, :] >= recent_start[:, None, None]) & (
        recent_slots[None, None, :] <= query_slots[:, :, None]
    )
    chosen_ok = index_valid[:, None, :].expand(batch, q_len, index.shape[1])
    mask = torch.cat([chosen_ok, recent_ok], dim=-1)[:, None]  # [B, 1, q, N + R]
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


def _inputs(device, dtype, context, q_len, heads, kv_heads, dim, seed=0, batch=1, recent=RECENT):
    """Kernel arguments: random caches, ``RATIO`` of each row's prefix selected (sorted), ``recent`` recent slots."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    recent_start = context - recent
    n_index = math.ceil(round(RATIO * recent_start, 9))
    index = torch.stack(
        [torch.randperm(recent_start, generator=gen)[:n_index].sort().values for _ in range(batch)]
    )
    return dict(
        query=torch.randn(batch, heads, q_len, dim, generator=gen).to(device, dtype),
        key=torch.randn(batch, kv_heads, context, dim, generator=gen).to(device, dtype),
        value=torch.randn(batch, kv_heads, context, dim, generator=gen).to(device, dtype),
        index=index.to(device, torch.int32),
        index_count=torch.full((batch,), n_index, dtype=torch.int32, device=device),
        recent_start=torch.full((batch,), recent_start, device=device),
        start=torch.full((batch,), context - q_len, device=device),
        scale=dim**-0.5,
    )


@register_benchmark("token_sparse")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads, kv_heads, dim = (4, 2, 64) if quick else (HEADS, KV_HEADS, HEAD_DIM)
    contexts = (1024,) if quick else (65536, 131072)
    for context in contexts:
        for q_len in (1, 4):
            a = _inputs(device, dtype, context, q_len, heads, kv_heads, dim)
            n_index = a["index"].shape[1]
            size = dtype.itemsize
            # selected + recent K and V rows, the index, the queries and the outputs
            kv_bytes = (n_index + RECENT) * kv_heads * dim * 2 * size
            bytes_moved = kv_bytes + n_index * 4 + 2 * heads * q_len * dim * size
            params = dict(
                context=context, q_len=q_len, selected=n_index, recent=RECENT, batch=1,
                heads=heads, kv_heads=kv_heads, head_dim=dim,
            )  # fmt: skip
            yield KernelCase(
                "token_sparse", "triton", params, bytes_moved, lambda a=a: token_sparse_attention_triton(**a)
            )
            valid = torch.ones_like(a["index"], dtype=torch.bool)
            index_long = a["index"].long()

            def run_sdpa(a=a, valid=valid, index_long=index_long, context=context):
                return gather_sdpa(
                    a["query"], a["key"], a["value"], index_long, valid, context - RECENT, context,
                    a["recent_start"], a["start"], a["scale"],
                )  # fmt: skip

            yield KernelCase("token_sparse", "gather_sdpa", params, bytes_moved, run_sdpa)
