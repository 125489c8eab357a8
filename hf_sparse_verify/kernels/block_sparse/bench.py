"""Benchmark entry ``block_sparse``: Llama-3.1-8B verify attention (32 query heads, 8 KV heads, head_dim 128) over a
64K / 128K cache in blocks of 64, about 7% of the blocks selected per KV head, q = 1, 4, 8, 16 new tokens at the
end of the cache.

Variants: ``triton_shared`` (one list per KV head), ``triton_merged`` (per-query sets that share 80% of their
blocks, run as the union plus ``query_mask``), and ``sdpa_masked_shared`` / ``sdpa_masked_merged`` (dense SDPA
with a boolean mask over the same slots). ``bytes_moved`` is the same for all variants of one case: K and V of
the union of attended blocks (listed plus forced) + queries + output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_sparse_verify.kernels.bench_registry import KernelCase, register_benchmark
from hf_sparse_verify.kernels.block_sparse.naive import attended_slots, forced_block_mask, selected_block_mask
from hf_sparse_verify.kernels.block_sparse.op import block_sparse_attention, merge_query_blocks

SELECTED = 0.07
OVERLAP = 0.8


def _shared_index(gen, h_kv, num_blocks, n, device):
    """``[1, H_kv, n]`` ascending random blocks and ``[1, H_kv]`` counts."""
    index = torch.stack([torch.randperm(num_blocks, generator=gen)[:n].sort().values for _ in range(h_kv)])
    count = torch.full((1, h_kv), n, dtype=torch.int32)
    return index[None].to(device, torch.int32), count.to(device)


def _per_query_index(gen, h_kv, q_len, num_blocks, n, device):
    """Per-query sets of ``n`` blocks, any two sharing ``OVERLAP * n``: a common core plus disjoint extras."""
    core = round(OVERLAP * n)
    extra = n - core
    rows = []
    for _ in range(h_kv):
        perm = torch.randperm(num_blocks, generator=gen)
        rows.append(
            torch.stack(
                [
                    torch.cat([perm[:core], perm[core + i * extra : core + (i + 1) * extra]])
                    for i in range(q_len)
                ]
            )
        )
    index = torch.stack(rows)[None].to(device)  # [1, H_kv, q, n]
    count = torch.full((1, h_kv, q_len), n, device=device)
    return merge_query_blocks(index, count, num_blocks)


@register_benchmark("block_sparse")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    heads, kv_heads, head_dim, block_size = (4, 2, 64, 64) if quick else (32, 8, 128, 64)
    contexts = (1024,) if quick else (65536, 131072)
    q_lens = (1, 4) if quick else (1, 4, 8, 16)
    gen = torch.Generator().manual_seed(0)
    elem = torch.tensor([], dtype=dtype).element_size()
    for context in contexts:
        key = torch.randn(1, kv_heads, context, head_dim, device=device, dtype=dtype)
        value = torch.randn_like(key)
        num_blocks = context // block_size
        n = max(1, round(SELECTED * num_blocks))
        pad = torch.zeros(1, dtype=torch.int64, device=device)
        for q_len in q_lens:
            query = torch.randn(1, q_len, heads, head_dim, device=device, dtype=dtype).transpose(1, 2)
            start = torch.full((1,), context - q_len, dtype=torch.int64, device=device)
            forced = forced_block_mask(start, pad, q_len, block_size, num_blocks)[:, None]  # [1, 1, NB]
            schedules = {
                "shared": (*_shared_index(gen, kv_heads, num_blocks, n, device), None),
                "merged": _per_query_index(gen, kv_heads, q_len, num_blocks, n, device),
            }
            for mode, (index, count, query_mask) in schedules.items():
                union = selected_block_mask(index, count, num_blocks).squeeze(2) | forced  # [1, H_kv, NB]
                loaded = int(union.sum()) * block_size * head_dim * elem * 2
                bytes_moved = loaded + 2 * query.numel() * elem
                params = dict(
                    context=context,
                    q_len=q_len,
                    block_size=block_size,
                    selected_per_query=n,
                    union_blocks=int(union.sum()) // kv_heads,
                    heads=heads,
                    kv_heads=kv_heads,
                    head_dim=head_dim,
                    index=mode,
                )
                yield KernelCase(
                    "block_sparse",
                    f"triton_{mode}",
                    params,
                    bytes_moved,
                    lambda q=query, k=key, v=value, s=start, p=pad, i=index, c=count, m=query_mask: (
                        block_sparse_attention(q, k, v, s, p, i, c, block_size=block_size, query_mask=m)
                    ),
                )
                allowed = attended_slots(start, pad, index, count, block_size, q_len, context, query_mask)
                mask = allowed.repeat_interleave(heads // kv_heads, dim=1)  # [1, H, q, C]
                yield KernelCase(
                    "block_sparse",
                    f"sdpa_masked_{mode}",
                    params,
                    bytes_moved,
                    lambda q=query, k=key, v=value, m=mask: F.scaled_dot_product_attention(
                        q, k, v, attn_mask=m, enable_gqa=True
                    ).transpose(1, 2),
                )
