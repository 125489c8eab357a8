"""Per-block key bounds (Quest's block score: *Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference*, Tang et al. 2024): the elementwise minimum and maximum of each block's valid keys, and the score

    score[b, g, j] = sum over the query heads h of KV head g of  sum_d max(q[h, d] * min[j, d], q[h, d] * max[j, d])

an upper bound on ``q . k`` over the block's keys (per head), where the mean key's score is their average. A block
holding one key that matches the query scores high under the bound even when the block's other keys pull its mean
down: the case the mean misses.

Plain PyTorch on device tensors with fixed shapes (no host sync: capturable in the verify graphs); the references
the tests hold them to are the loops in the tests. Bounds are float32 ``[2, B, H_kv, n, D]`` (minimum, maximum);
a block without a valid slot holds zeros and scores ``-inf``.
"""

from __future__ import annotations

import torch

from .naive import block_is_valid, max_touched_blocks, num_blocks


def _bounds_of(blocks: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``blocks`` ``[B, H, n, S, D]`` with ``valid`` ``[B, 1, n, S, 1]`` -> ``[2, B, H, n, D]`` float32 (zeros where a
    block has no valid slot)."""
    blocks = blocks.float()
    low = blocks.masked_fill(~valid, float("inf")).amin(dim=3)
    high = blocks.masked_fill(~valid, float("-inf")).amax(dim=3)
    empty = ~valid.any(dim=3)  # [B, 1, n, 1]
    return torch.stack([low.masked_fill(empty, 0.0), high.masked_fill(empty, 0.0)])


def build_block_bounds(
    keys: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int = 64
) -> torch.Tensor:
    """Bounds of every block of the cache (once, after the prefill).

    Args:
        keys: ``[B, H_kv, C, D]`` key cache (any float dtype).
        pad, length: ``[B]`` int; the valid slots of row ``b`` are ``pad[b] <= slot < length[b]``.
        block_size: slots per block.

    Returns:
        ``[2, B, H_kv, ceil(C / block_size), D]`` float32.

    Example:
        >>> keys = torch.arange(8.0).view(1, 1, 8, 1)
        >>> build_block_bounds(keys, torch.tensor([1]), torch.tensor([6]), block_size=4)[:, 0, 0, :, 0]
        tensor([[1., 4.],
                [3., 5.]])
    """
    batch, heads, capacity, dim = keys.shape
    n = num_blocks(capacity, block_size)
    if n * block_size != capacity:
        keys = torch.nn.functional.pad(keys, (0, 0, 0, n * block_size - capacity))
    slot = torch.arange(n * block_size, device=keys.device)
    valid = (slot >= pad.to(keys.device)[:, None]) & (slot < length.to(keys.device)[:, None])  # [B, n * S]
    return _bounds_of(
        keys.view(batch, heads, n, block_size, dim), valid.view(batch, 1, n, block_size, 1)
    ).contiguous()


def update_block_bounds(
    keys: torch.Tensor,
    bounds: torch.Tensor,
    pad: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    block_size: int = 64,
) -> None:
    """Recompute in place the bounds of the blocks holding slots ``start[b] .. start[b] + q_len - 1`` (valid slots
    ``pad[b] <= slot < start[b] + q_len``: left-overs of rejected drafts past the new tokens are ignored), as
    `update_block_summaries` does for mean keys. A fixed number of blocks per row (the most ``q_len`` slots can
    touch), gathered and scattered by device indices: no host sync.

    Example:
        >>> keys = torch.zeros(1, 1, 8, 1)
        >>> bounds = build_block_bounds(keys, torch.tensor([0]), torch.tensor([5]), block_size=4)
        >>> keys[0, 0, 5:7] = torch.tensor([[2.0], [-3.0]])
        >>> update_block_bounds(keys, bounds, torch.tensor([0]), torch.tensor([5]), q_len=2, block_size=4)
        >>> bounds[:, 0, 0, 1, 0]
        tensor([-3.,  2.])
    """
    batch, heads, capacity, dim = keys.shape
    n = bounds.shape[3]
    touched = max_touched_blocks(q_len, block_size)
    device = keys.device
    start, pad = start.to(device).long(), pad.to(device).long()
    block = (start // block_size)[:, None] + torch.arange(touched, device=device)  # [B, T]
    block = block.clamp_max(n - 1)
    slot = block[:, :, None] * block_size + torch.arange(block_size, device=device)  # [B, T, S]
    valid = (slot >= pad[:, None, None]) & (slot < (start + q_len)[:, None, None]) & (slot < capacity)
    index = slot.clamp_max(capacity - 1).view(batch, 1, touched * block_size, 1).expand(batch, heads, -1, dim)
    gathered = keys.gather(2, index).view(batch, heads, touched, block_size, dim)
    fresh = _bounds_of(gathered, valid.view(batch, 1, touched, block_size, 1))  # [2, B, H, T, D]
    target = block.view(1, batch, 1, touched, 1).expand(2, batch, heads, touched, dim)
    bounds.scatter_(3, target, fresh.to(bounds.dtype))


def score_block_bounds(
    query: torch.Tensor, bounds: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int = 64,
    scale: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """The bound score of every block against one query row per sequence (see the module docstring), times
    ``scale``; blocks without a valid slot (``pad[b] <= slot < length[b]``) score ``-inf``.

    Args:
        query: ``[B, H, D]``, or ``[R, B, H, D]`` for several query rows at once.
        bounds: ``[2, B, H_kv, n, D]`` from `build_block_bounds` (the same for every query row).

    Returns:
        ``[B, H_kv, n]`` (or ``[R, B, H_kv, n]``) float32.

    Example (one head, two channels: block 0 holds keys (1, 0) and (-1, 0), block 1 the single key (0, 0.5)):
        >>> bounds = torch.tensor([[[-1.0, 0.0], [0.0, 0.5]], [[1.0, 0.0], [0.0, 0.5]]])[:, None, None]
        >>> score_block_bounds(torch.tensor([[[1.0, 1.0]]]), bounds, torch.tensor([0]), torch.tensor([3]), 2)
        tensor([[[1.0000, 0.5000]]])
    """
    rows = query.dim() == 4
    q = query if rows else query[None]
    r, batch, heads, dim = q.shape
    kv_heads, n = bounds.shape[2], bounds.shape[3]
    q = q.float().view(r, batch, kv_heads, heads // kv_heads, 1, dim)  # [R, B, H_kv, G, 1, D]
    low, high = bounds[0][None, :, :, None], bounds[1][None, :, :, None]  # [1, B, H_kv, 1, n, D]
    scores = torch.maximum(q * low, q * high).sum(dim=-1).sum(dim=3) * scale  # [R, B, H_kv, n]
    valid = block_is_valid(n, pad.to(query.device), length.to(query.device), block_size)  # [B, n]
    scores = scores.masked_fill(~valid[None, :, None], float("-inf"))
    return scores if rows else scores[0]
