"""Plain-PyTorch references for block summaries (the definitions the Triton kernels are tested against).

A row's cache ``[C, D]`` is cut into blocks of ``block_size`` slots; block ``j`` holds slots
``[j * block_size, (j + 1) * block_size)``. The valid slots of row ``b`` are ``pad[b] <= slot < length[b]``.
The summary of a block is the mean of its valid keys (0 when it has none). All math is in float64.
"""

from __future__ import annotations

import torch


def num_blocks(capacity: int, block_size: int) -> int:
    """Blocks needed to cover ``capacity`` slots (the last one may be partial)."""
    return -(-capacity // block_size)


def max_touched_blocks(q_len: int, block_size: int) -> int:
    """The most blocks ``q_len`` consecutive slots can touch (they may straddle a block boundary)."""
    return 1 + -(-(q_len - 1) // block_size)


def naive_block_mean(keys: torch.Tensor, pad: int, length: int, block: int, block_size: int) -> torch.Tensor:
    """Mean of the valid keys of one block of one row: ``keys`` ``[H_kv, C, D]`` -> ``[H_kv, D]`` float64."""
    lo = max(block * block_size, pad)
    hi = min((block + 1) * block_size, length, keys.shape[1])
    if hi <= lo:
        return torch.zeros(keys.shape[0], keys.shape[2], dtype=torch.float64, device=keys.device)
    return keys[:, lo:hi].double().mean(dim=1)


def naive_build_block_summaries(
    keys: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Block means of the whole cache.

    Args:
        keys: ``[B, H_kv, C, D]``.
        pad, length: ``[B]`` integers; valid slots of row ``b`` are ``pad[b] <= slot < length[b]``.
        block_size: slots per block.

    Returns:
        ``[B, H_kv, ceil(C / block_size), D]`` float64.
    """
    batch, heads, capacity, dim = keys.shape
    nblocks = num_blocks(capacity, block_size)
    out = torch.zeros(batch, heads, nblocks, dim, dtype=torch.float64, device=keys.device)
    for b in range(batch):
        for j in range(nblocks):
            out[b, :, j] = naive_block_mean(keys[b], int(pad[b]), int(length[b]), j, block_size)
    return out


def naive_update_block_summaries(
    keys: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    block_size: int,
) -> None:
    """Recompute, in place, the blocks holding slots ``start[b] .. start[b] + q_len - 1`` of each row.

    Valid slots for the recompute are ``pad[b] <= slot < start[b] + q_len``: slots past the new tokens are
    left-overs of rejected drafts and are ignored. Other blocks are left as they are.
    """
    nblocks = mean_key.shape[2]
    for b in range(keys.shape[0]):
        first, end = int(start[b]), int(start[b]) + q_len
        for j in range(first // block_size, min((end - 1) // block_size + 1, nblocks)):
            mean_key[b, :, j] = naive_block_mean(keys[b], int(pad[b]), end, j, block_size).to(mean_key.dtype)


def block_is_valid(nblocks: int, pad: torch.Tensor, length: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[B, nblocks]`` bool: whether each block holds at least one valid slot."""
    j = torch.arange(nblocks, device=pad.device)
    return ((j + 1) * block_size > pad[:, None]) & (j * block_size < length[:, None])


def naive_score_blocks(
    query: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    length: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """Block scores: for each KV head, the sum over its query heads of ``q . mean_key * scale``.

    Args:
        query: ``[B, H, D]`` or ``[Lyr, B, H, D]``.
        mean_key: ``[B, H_kv, n, D]`` or ``[Lyr, B, H_kv, n, D]``.

    Returns:
        ``[B, H_kv, n]`` (or ``[Lyr, B, H_kv, n]``) float64; blocks without a valid slot are ``-inf``.
    """
    if query.dim() == 4:
        return torch.stack(
            [naive_score_blocks(q, m, pad, length, block_size, scale) for q, m in zip(query, mean_key)]
        )
    batch, heads, dim = query.shape
    kv_heads, nblocks = mean_key.shape[1], mean_key.shape[2]
    group = heads // kv_heads
    scores = torch.zeros(batch, kv_heads, nblocks, dtype=torch.float64, device=query.device)
    for h in range(heads):
        per_head = torch.einsum("bd,bnd->bn", query[:, h].double(), mean_key[:, h // group].double())
        scores[:, h // group] += per_head * scale
    valid = block_is_valid(nblocks, pad, length, block_size)
    return scores.masked_fill(~valid[:, None], float("-inf"))


def naive_select_top_blocks(
    scores: torch.Tensor, n: int, start: torch.Tensor, pad: torch.Tensor, q_len: int, block_size: int
) -> list[list[list[int]]]:
    """The selected block set of each (row, KV head) as a sorted Python list (loops; for tests).

    Forced: the sink block ``pad[b] // block_size`` and the blocks holding slots
    ``start[b] .. start[b] + q_len - 1``. Then the ``n`` highest-scored other blocks with a finite score.
    """
    batch, kv_heads, _ = scores.shape
    out = []
    for b in range(batch):
        forced = {int(pad[b]) // block_size}
        forced |= set(range(int(start[b]) // block_size, (int(start[b]) + q_len - 1) // block_size + 1))
        rows = []
        for h in range(kv_heads):
            s = scores[b, h].tolist()
            others = [j for j in range(len(s)) if j not in forced and s[j] != float("-inf")]
            others.sort(key=lambda j: -s[j])
            rows.append(sorted(forced | set(others[:n])))
        out.append(rows)
    return out
