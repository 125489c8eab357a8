"""Token-sparse attention, plain PyTorch: the definition the Triton kernel is tested against.

Query ``i`` of row ``b`` sits at cache slot ``start[b] + i`` and attends to the union of
- the selected prefix slots ``index[b, :index_count[b]]`` (all below ``recent_start[b]``), and
- the recent slots ``j`` with ``recent_start[b] <= j <= start[b] + i``.
A query that attends to no slot gets a zero output.
"""

from __future__ import annotations

import torch


def token_sparse_mask(
    index: torch.Tensor,
    index_count: torch.Tensor,
    recent_start: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    capacity: int,
) -> torch.Tensor:
    """``[B, q, capacity]`` bool: which cache slots each query attends to.

    Example:
        >>> m = token_sparse_mask(torch.tensor([[1, 3, 0]]), torch.tensor([2]), torch.tensor([5]),
        ...                       torch.tensor([5]), 2, 8)
        >>> m.int().tolist()
        [[[0, 1, 0, 1, 0, 1, 0, 0], [0, 1, 0, 1, 0, 1, 1, 0]]]
    """
    batch, width = index.shape
    device = index.device
    valid = torch.arange(width, device=device)[None, :] < index_count[:, None]  # [B, N]
    safe = torch.where(valid, index.long(), torch.zeros_like(index, dtype=torch.long))
    # scatter_add, not scatter_: ignored entries may repeat a valid slot, and scatter_ with duplicates is racy
    hits = torch.zeros(batch, capacity, dtype=torch.int32, device=device)
    selected = hits.scatter_add_(1, safe, valid.int()) > 0  # [B, C]
    slots = torch.arange(capacity, device=device)[None, None, :]
    query_slots = start[:, None].long() + torch.arange(q_len, device=device)[None, :]  # [B, q]
    recent = (slots >= recent_start[:, None, None]) & (slots <= query_slots[:, :, None])  # [B, q, C]
    return selected[:, None, :] | recent


def token_sparse_attention_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    index_count: torch.Tensor,
    recent_start: torch.Tensor,
    start: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Dense masked softmax over all ``C`` cache slots, in float32 (float64 for float64 inputs).

    Args:
        query: ``[B, H, q, D]``.
        key, value: ``[B, H_kv, C, D]``; query head ``h`` reads KV head ``h // (H // H_kv)``.
        index: ``[B, N]`` selected prefix slots; only ``index[b, :index_count[b]]`` are read.
        index_count, recent_start, start: ``[B]``.
        scale: softmax scale.

    Returns:
        ``[B, q, H, D]`` in ``query.dtype``.
    """
    batch, heads, q_len, _ = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    compute = torch.promote_types(query.dtype, torch.float32)
    mask = token_sparse_mask(index, index_count, recent_start, start, q_len, capacity)  # [B, q, C]
    mask = mask[:, None]  # [B, 1, q, C]
    k = key.to(compute).repeat_interleave(heads // kv_heads, dim=1)  # [B, H, C, D]
    v = value.to(compute).repeat_interleave(heads // kv_heads, dim=1)
    logits = torch.matmul(query.to(compute), k.transpose(-1, -2)) * scale  # [B, H, q, C]
    weights = logits.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    weights = torch.where(mask.any(dim=-1, keepdim=True), weights, torch.zeros_like(weights))
    return torch.matmul(weights, v).transpose(1, 2).to(query.dtype)
