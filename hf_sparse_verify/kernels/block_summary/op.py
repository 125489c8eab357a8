"""Block summaries for block-sparse verification: per-block mean keys (built once at prefill, then updated
incrementally after every forward), block scores against one query row, and top-n block selection.

Scoring follows Eq. 5 of "Accelerate Speculative Decoding with Sparse Computation in Verification"
(the sparse-verification paper): ``s_{h,b} = q_0 . mean(k_{h,b})`` with ``q_0`` the query of the first draft token. Blocks belong
to KV heads, so the query heads of a GQA group must agree on one score per block: we take the SUM over the
group (as NSA does for its shared GQA selection, cited by SSV, the SSV paper). The sum is linear in the queries, so
it equals the dot product of the summed group query with the mean key, i.e. it ranks blocks by the group's
total (unnormalised) attention logit mass; a max would let one head with a large query norm decide alone.

Selection always keeps the sink block (the block holding slot ``pad[b]``) and the blocks holding the new
tokens (slots ``start[b] .. start[b] + q_len - 1``), which the paper keeps "without eviction", plus the ``n``
highest-scored other blocks.
"""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import (
    max_touched_blocks,
    naive_build_block_summaries,
    naive_score_blocks,
    naive_update_block_summaries,
    num_blocks,
)

_INT_DTYPES = (torch.int32, torch.int64)


def _check_block_size(block_size: int) -> None:
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 1, got {block_size}")


def _check_positions(batch: int, device: torch.device, **positions: torch.Tensor) -> None:
    for name, t in positions.items():
        if t.shape != (batch,):
            raise ValueError(f"{name} must have shape [B] = [{batch}], got {list(t.shape)}")
        if t.dtype not in _INT_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}; pass e.g. {name}.long()")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but the cache is on {device}; move it to {device}")


def _check_keys(keys: torch.Tensor) -> None:
    if keys.dim() != 4:
        raise ValueError(f"keys must be [B, H_kv, C, D], got {list(keys.shape)}")
    if not keys.is_floating_point():
        raise ValueError(f"keys must be a floating-point tensor, got {keys.dtype}")


def _check_mean_key(keys: torch.Tensor, mean_key: torch.Tensor, block_size: int) -> None:
    batch, kv_heads, capacity, dim = keys.shape
    want = [batch, kv_heads, num_blocks(capacity, block_size), dim]
    if list(mean_key.shape) != want:
        raise ValueError(
            f"mean_key must be [B, H_kv, ceil(C / block_size), D] = {want}, got {list(mean_key.shape)}"
        )
    if mean_key.dtype != torch.float32:
        raise ValueError(
            f"mean_key must be float32, got {mean_key.dtype}; build it with build_block_summaries"
        )
    if mean_key.device != keys.device:
        raise ValueError(f"mean_key is on {mean_key.device} but keys are on {keys.device}")


def _check_score_inputs(query, mean_key, pad, length, block_size) -> None:
    _check_block_size(block_size)
    if not (query.dim() == 3 and mean_key.dim() == 4) and not (query.dim() == 4 and mean_key.dim() == 5):
        raise ValueError(
            "query/mean_key must be [B, H, D]/[B, H_kv, n, D], or with a leading layer dimension "
            f"[Lyr, B, H, D]/[Lyr, B, H_kv, n, D]; got {list(query.shape)} and {list(mean_key.shape)}"
        )
    *lead_q, heads, dim = query.shape
    *lead_m, kv_heads, _, dim_m = mean_key.shape
    if lead_q != lead_m or dim != dim_m:
        raise ValueError(
            f"query {list(query.shape)} and mean_key {list(mean_key.shape)} disagree on layers, batch or D"
        )
    if heads % kv_heads:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if not query.is_floating_point() or mean_key.dtype != torch.float32:
        raise ValueError(
            f"query must be floating point and mean_key float32, got {query.dtype}, {mean_key.dtype}"
        )
    if query.device != mean_key.device:
        raise ValueError(f"query is on {query.device} but mean_key is on {mean_key.device}")
    _check_positions(lead_q[-1], mean_key.device, pad=pad, length=length)


# ----------------------------------------------------------------------------------------------- build


@torch.library.custom_op("hsv::block_summary_build", mutates_args=())
def _build(keys: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int) -> torch.Tensor:
    batch, kv_heads, capacity, dim = keys.shape
    out = torch.empty(
        batch, kv_heads, num_blocks(capacity, block_size), dim, dtype=torch.float32, device=keys.device
    )
    if triton_runs_on(keys.device):
        from .kernel import launch_build

        launch_build(keys, pad, length, block_size, out)
    else:
        out.copy_(naive_build_block_summaries(keys, pad, length, block_size))
    return out


@_build.register_fake
def _(keys, pad, length, block_size):
    batch, kv_heads, capacity, dim = keys.shape
    return keys.new_empty(batch, kv_heads, num_blocks(capacity, block_size), dim, dtype=torch.float32)


def build_block_summaries(
    keys: torch.Tensor, pad: torch.Tensor, length: torch.Tensor, block_size: int = 64
) -> torch.Tensor:
    """Mean key of every block of the cache (once, after the prefill).

    Args:
        keys: ``[B, H_kv, C, D]`` key cache (any float dtype, may be a non-contiguous view).
        pad: ``[B]`` int, first valid slot of each row (left padding).
        length: ``[B]`` int, one past the last valid slot of each row.
        block_size: slots per block, a power of two (default 64).

    Returns:
        ``mean_key`` ``[B, H_kv, ceil(C / block_size), D]`` float32: the mean of the valid keys
        (``pad[b] <= slot < length[b]``) of each block; 0 for blocks without a valid slot.

    Example:
        >>> keys = torch.randn(1, 2, 10, 4)
        >>> pad, length = torch.tensor([1]), torch.tensor([7])
        >>> mean_key = build_block_summaries(keys, pad, length, block_size=4)
        >>> mean_key.shape
        torch.Size([1, 2, 3, 4])
        >>> torch.allclose(mean_key[0, :, 1], keys[0, :, 4:7].mean(1)), float(mean_key[0, 0, 2].abs().sum())
        (True, 0.0)
    """
    _check_keys(keys)
    _check_block_size(block_size)
    _check_positions(keys.shape[0], keys.device, pad=pad, length=length)
    return torch.ops.hsv.block_summary_build(keys, pad, length, block_size)


# ---------------------------------------------------------------------------------------------- update


@torch.library.custom_op("hsv::block_summary_update", mutates_args=("mean_key",))
def _update(
    keys: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    block_size: int,
) -> None:
    if triton_runs_on(keys.device):
        from .kernel import launch_update

        launch_update(keys, mean_key, pad, start, q_len, block_size)
    else:
        naive_update_block_summaries(keys, mean_key, pad, start, q_len, block_size)


@_update.register_fake
def _(keys, mean_key, pad, start, q_len, block_size):
    return None


def update_block_summaries(
    keys: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    start: torch.Tensor,
    q_len: int,
    block_size: int = 64,
) -> None:
    """Refresh ``mean_key`` in place after a forward wrote ``q_len`` new keys at slots
    ``start[b] .. start[b] + q_len - 1`` of each row.

    Only the blocks holding a new slot are recomputed (at most ``1 + ceil((q_len - 1) / block_size)`` per
    row), from the cache, with valid slots ``pad[b] <= slot < start[b] + q_len``: slots past the new tokens
    (left-overs of rejected drafts) are ignored. Blocks wholly before ``start[b]`` keep their summaries, so
    ``start[b]`` must not exceed the previous step's ``start + q_len`` (a rollback moves it back, never past).
    Blocks wholly after the new tokens may hold stale means; `score_blocks` masks them by ``length``.
    The launch grid depends only on shapes and ``q_len``: no host sync, capturable in a CUDA graph.

    Args:
        keys: ``[B, H_kv, C, D]`` key cache, new keys already written.
        mean_key: ``[B, H_kv, ceil(C / block_size), D]`` float32, from `build_block_summaries`; updated in place.
        pad: ``[B]`` int, first valid slot of each row.
        start: ``[B]`` int, slot of the first new key of each row (rows may differ).
        q_len: number of new keys per row (host int).
        block_size: slots per block, a power of two (default 64).

    Example:
        >>> keys = torch.randn(1, 1, 16, 4)
        >>> pad = torch.tensor([0])
        >>> mean_key = build_block_summaries(keys, pad, torch.tensor([5]), block_size=4)
        >>> keys[0, 0, 5:8] = 1.0
        >>> update_block_summaries(keys, mean_key, pad, torch.tensor([5]), q_len=3, block_size=4)
        >>> torch.allclose(mean_key[0, 0, 1], keys[0, 0, 4:8].mean(0))
        True
    """
    _check_keys(keys)
    _check_block_size(block_size)
    _check_mean_key(keys, mean_key, block_size)
    _check_positions(keys.shape[0], keys.device, pad=pad, start=start)
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1, got {q_len}")
    torch.ops.hsv.block_summary_update(keys, mean_key, pad, start, q_len, block_size)


# ----------------------------------------------------------------------------------------------- score


@torch.library.custom_op("hsv::block_summary_score", mutates_args=())
def _score(
    query: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    length: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    layered = query.dim() == 4
    q = query if layered else query.unsqueeze(0)  # [Lyr, B, H, D]
    m = mean_key if layered else mean_key.unsqueeze(0)  # [Lyr, B, H_kv, n, D]
    if triton_runs_on(query.device):
        from .kernel import launch_score

        out = torch.empty(m.shape[:-1], dtype=torch.float32, device=query.device)
        launch_score(q, m, pad, length, block_size, scale, out)
    else:
        out = naive_score_blocks(q, m, pad, length, block_size, scale).float()
    return out if layered else out.squeeze(0)


@_score.register_fake
def _(query, mean_key, pad, length, block_size, scale):
    return mean_key.new_empty(mean_key.shape[:-1])


def score_blocks(
    query: torch.Tensor,
    mean_key: torch.Tensor,
    pad: torch.Tensor,
    length: torch.Tensor,
    block_size: int = 64,
    scale: float = 1.0,
) -> torch.Tensor:
    """Score every block of every KV head against one query row per sequence.

    ``score[b, g, j] = sum over the query heads h of KV head g of (query[b, h] . mean_key[b, g, j]) * scale``
    (GQA: head ``h`` uses KV head ``h // (H // H_kv)``); blocks without a valid slot
    (``pad[b] <= slot < length[b]``) score ``-inf``.

    Args:
        query: ``[B, H, D]`` (e.g. the first draft token's query), or ``[Lyr, B, H, D]`` for several layers
            in one launch.
        mean_key: ``[B, H_kv, n, D]`` float32 (or ``[Lyr, B, H_kv, n, D]``).
        pad, length: ``[B]`` int, shared by all layers.
        block_size: slots per block, a power of two (default 64).
        scale: multiplies the scores (e.g. the softmax scale; it does not change the ranking).

    Returns:
        ``[B, H_kv, n]`` (or ``[Lyr, B, H_kv, n]``) float32.

    Example:
        >>> mean_key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]]])  # [1, 1, 3, 2]
        >>> query = torch.tensor([[[2.0, 1.0], [1.0, 1.0]]])  # [1, 2, 2]: two heads share the KV head
        >>> score_blocks(query, mean_key, torch.tensor([0]), torch.tensor([4]), block_size=2)
        tensor([[[3., 2., -inf]]])
    """
    _check_score_inputs(query, mean_key, pad, length, block_size)
    return torch.ops.hsv.block_summary_score(query, mean_key, pad, length, block_size, float(scale))


# ---------------------------------------------------------------------------------------------- select


def select_top_blocks(
    scores: torch.Tensor, n: int, start: torch.Tensor, pad: torch.Tensor, q_len: int, block_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks each (row, KV head) attends to: forced blocks plus the ``n`` best others.

    Forced: the sink block ``pad[b] // block_size`` and the blocks holding the new tokens, slots
    ``start[b] .. start[b] + q_len - 1``. Then the ``n`` highest-scored blocks that are not forced and have a
    finite score (fewer when fewer exist). Plain torch ops, no host sync.

    Args:
        scores: ``[B, H_kv, nblocks]`` (or ``[Lyr, B, H_kv, nblocks]``) float, from `score_blocks`.
        n: blocks to pick by score (host int).
        start, pad: ``[B]`` int.
        q_len: new tokens per row (host int).
        block_size: slots per block (default 64).

    Returns:
        ``block_index`` ``[..., B, H_kv, N]`` int32, ``N = min(nblocks, n + 1 + max_touched_blocks(q_len))``:
        the selected blocks, strictly ascending in the first ``block_count`` entries; the entries past the
        count repeat the last selected block (readers ignore them).
        ``block_count`` ``[..., B, H_kv]`` int32.

    Example:
        >>> scores = torch.tensor([[[0.0, 5.0, 1.0, 9.0, 2.0, 3.0]]])  # [1, 1, 6]
        >>> index, count = select_top_blocks(scores, 1, torch.tensor([8]), torch.tensor([0]), q_len=2, block_size=2)
        >>> index.tolist(), count.tolist()  # sink 0, new tokens (slots 8, 9) in block 4, best other block 3
        ([[[0, 3, 4, 4]]], [[3]])
    """
    _check_block_size(block_size)
    if scores.dim() < 3:
        raise ValueError(
            f"scores must be [B, H_kv, nblocks] (or with leading dims), got {list(scores.shape)}"
        )
    *lead, batch, kv_heads, nblocks = scores.shape
    _check_positions(batch, scores.device, start=start, pad=pad)
    if n < 0 or q_len < 1:
        raise ValueError(f"need n >= 0 and q_len >= 1, got n={n}, q_len={q_len}")

    n_last = max_touched_blocks(q_len, block_size)
    first_new = start.long() // block_size  # [B]
    last_new = (start.long() + q_len - 1) // block_size
    new = first_new[:, None] + torch.arange(n_last, device=scores.device)  # [B, n_last]
    new = torch.minimum(new, last_new[:, None])
    sink = pad.long()[:, None] // block_size  # [B, 1]
    forced = torch.cat([sink, new], dim=-1).clamp(max=nblocks - 1)  # [B, F]
    forced = forced[:, None, :].expand(*lead, batch, kv_heads, forced.shape[-1])

    is_forced = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, forced, True)
    k = min(n, nblocks)
    top_s, top_i = scores.masked_fill(is_forced, float("-inf")).topk(k, dim=-1)
    none = nblocks  # sentinel: sorts after every real block
    top_i = top_i.masked_fill(top_s == float("-inf"), none)

    picked = torch.cat([forced, top_i], dim=-1).sort(dim=-1).values
    repeat = torch.zeros_like(picked, dtype=torch.bool)
    repeat[..., 1:] = picked[..., 1:] == picked[..., :-1]
    picked = picked.masked_fill(repeat, none).sort(dim=-1).values[..., : min(picked.shape[-1], nblocks)]
    count = (picked < none).sum(dim=-1)
    last = picked.gather(-1, (count - 1).clamp(min=0)[..., None])
    block_index = torch.where(picked < none, picked, last)
    return block_index.int(), count.int()
