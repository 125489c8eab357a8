"""Plain-PyTorch reference of block-sparse verify attention: an explicit boolean mask over all ``C`` cache slots
and a dense masked softmax. This is the definition the Triton kernel is tested against.

Which slots query ``i`` of row ``b`` attends (KV head ``h``), with ``BS = block_size`` and block ``n`` = slots
``[n * BS, (n + 1) * BS)``:

- the slots of its blocks: the selected blocks (``block_index[b, h, :block_count[b, h]]``; in the merged variant
  only the entries ``n`` with ``query_mask[b, h, i, n]``), plus the forced blocks (`forced_block_mask`): the sink
  block ``pad[b] // BS`` (the block holding the row's first real token) and the local blocks
  ``start[b] // BS .. (start[b] + q - 1) // BS`` (every block holding a new token);
- intersected with the causal/padding rule ``pad[b] <= slot <= start[b] + i``.

A block that is both selected and forced counts once (the mask is a set). Rows with no allowed slot (only possible
for ``start[b] + i < pad[b]``) give zeros.
"""

from __future__ import annotations

import torch


def forced_block_mask(
    start: torch.Tensor, pad: torch.Tensor, q_len: int, block_size: int, num_blocks: int
) -> torch.Tensor:
    """The blocks every query of a row attends whether selected or not, ``[B, num_blocks]`` bool.

    Sink: the block holding slot ``pad[b]`` (the first real token; block 0 when there is no padding).
    Local: every block holding one of the new tokens' slots ``start[b] .. start[b] + q_len - 1``.
    A selector can use this to leave these blocks out of its budget.
    """
    blocks = torch.arange(num_blocks, device=start.device)  # [NB]
    first = (pad.long() // block_size)[:, None]  # [B, 1]
    lo = (start.long() // block_size)[:, None]
    hi = ((start.long() + q_len - 1) // block_size)[:, None]
    return (blocks == first) | ((blocks >= lo) & (blocks <= hi))


def selected_block_mask(
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    num_blocks: int,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Selected blocks as a mask, ``[B, H_kv, 1, num_blocks]`` (shared index) or ``[B, H_kv, q, num_blocks]``.

    Entries at or past ``block_count`` and ids outside ``[0, num_blocks)`` select nothing.
    """
    b, h_kv, n = block_index.shape
    entries = torch.arange(n, device=block_index.device)
    valid = (
        (entries < block_count[..., None]) & (block_index >= 0) & (block_index < num_blocks)
    )  # [B, H_kv, N]
    valid = valid[:, :, None, :]
    if query_mask is not None:
        valid = valid & query_mask.bool()  # [B, H_kv, q, N]
    ids = torch.where(valid, block_index[:, :, None, :].long(), num_blocks).expand(valid.shape)
    out = torch.zeros(*valid.shape[:3], num_blocks + 1, dtype=torch.bool, device=block_index.device)
    out.scatter_(-1, ids, True)
    return out[..., :num_blocks]


def attended_slots(
    start: torch.Tensor,
    pad: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    q_len: int,
    capacity: int,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The slots each query attends, ``[B, H_kv, q, C]`` bool (the module docstring gives the rule)."""
    num_blocks = -(-capacity // block_size)
    blocks = selected_block_mask(block_index, block_count, num_blocks, query_mask)  # [B, H_kv, 1|q, NB]
    blocks = blocks | forced_block_mask(start, pad, q_len, block_size, num_blocks)[:, None, None, :]
    in_block = blocks.repeat_interleave(block_size, dim=-1)[..., :capacity]  # [B, H_kv, 1|q, C]
    slots = torch.arange(capacity, device=start.device)
    q_pos = start.long()[:, None] + torch.arange(q_len, device=start.device)  # [B, q]
    causal = (slots <= q_pos[..., None]) & (slots >= pad.long()[:, None, None])  # [B, q, C]
    return in_block & causal[:, None]


def block_sparse_attention_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    block_size: int,
    scale: float,
    query_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference block-sparse verify attention (float32 math, float64 for float64 inputs).

    Args:
        query: ``[B, H, q, D]``; key, value: ``[B, H_kv, C, D]``; start, pad: ``[B]`` int;
        block_index: ``[B, H_kv, N]`` int; block_count: ``[B, H_kv]`` int;
        query_mask: ``[B, H_kv, q, N]`` bool for the merged variant, None for the shared index.

    Returns:
        ``[B, q, H, D]`` in ``query.dtype``.
    """
    b, h, q_len, d = query.shape
    h_kv, capacity = key.shape[1], key.shape[2]
    group = h // h_kv
    dtype = torch.promote_types(query.dtype, torch.float32)
    allowed = attended_slots(
        start, pad, block_index, block_count, block_size, q_len, capacity, query_mask
    )  # [B, H_kv, q, C]
    allowed = allowed.repeat_interleave(group, dim=1)  # [B, H, q, C]
    k = key.to(dtype).repeat_interleave(group, dim=1)  # [B, H, C, D]
    v = value.to(dtype).repeat_interleave(group, dim=1)
    scores = (query.to(dtype) @ k.transpose(-1, -2)) * scale  # [B, H, q, C]
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = probs @ v  # [B, H, q, D]
    return out.transpose(1, 2).to(query.dtype)
