"""Public block-sparse verify attention: input checks, the ``hsv::block_sparse_attention`` custom op (Triton where
it runs, else the reference) and `merge_query_blocks`, which builds the exact merged schedule from per-query
block sets."""

import math

import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.block_sparse.naive import block_sparse_attention_naive, selected_block_mask

_INT_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("hsv::block_sparse_attention", mutates_args=())
def _block_sparse_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    query_mask: torch.Tensor | None,
    block_size: int,
    scale: float,
    num_splits: int,
) -> torch.Tensor:
    if triton_runs_on(query.device):
        from hf_sparse_verify.kernels.block_sparse.kernel import block_sparse_attention_triton

        return block_sparse_attention_triton(
            query, key, value, start, pad, block_index, block_count, block_size, scale, query_mask, num_splits
        )
    return block_sparse_attention_naive(
        query, key, value, start, pad, block_index, block_count, block_size, scale, query_mask
    )


@_block_sparse_op.register_fake
def _(query, key, value, start, pad, block_index, block_count, query_mask, block_size, scale, num_splits):
    b, h, q_len, d = query.shape
    return query.new_empty(b, q_len, h, d)


def _check(query, key, value, start, pad, block_index, block_count, query_mask, block_size) -> None:
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(
            f"query must be [B, H, q, D] and key/value [B, H_kv, C, D]; got query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(f"value must have key's shape {tuple(key.shape)}; got {tuple(value.shape)}")
    b, h, q_len, d = query.shape
    kb, h_kv, _, kd = key.shape
    if kb != b or kd != d:
        raise ValueError(
            f"query {tuple(query.shape)} and key {tuple(key.shape)} must agree on batch (dim 0) and head_dim "
            "(dim 3)"
        )
    if h % h_kv:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({h_kv})")
    if query.dtype not in _FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(
            "query, key and value must share one dtype of float16/bfloat16/float32; got "
            f"{query.dtype}, {key.dtype}, {value.dtype}"
        )
    for name, t in (("start", start), ("pad", pad)):
        if t.shape != (b,) or t.dtype not in _INT_DTYPES:
            raise ValueError(f"{name} must be a [B]={b} int32/int64 tensor; got {tuple(t.shape)} {t.dtype}")
    if block_index.dim() != 3 or block_index.shape[:2] != (b, h_kv) or block_index.dtype not in _INT_DTYPES:
        raise ValueError(
            f"block_index must be [B, H_kv, N] = [{b}, {h_kv}, N] int32/int64; got "
            f"{tuple(block_index.shape)} {block_index.dtype}"
        )
    if block_count.shape != (b, h_kv) or block_count.dtype not in _INT_DTYPES:
        raise ValueError(
            f"block_count must be [B, H_kv] = [{b}, {h_kv}] int32/int64; got "
            f"{tuple(block_count.shape)} {block_count.dtype}"
        )
    if query_mask is not None:
        want = (b, h_kv, q_len, block_index.shape[2])
        if query_mask.shape != want or query_mask.dtype != torch.bool:
            raise ValueError(
                f"query_mask must be [B, H_kv, q, N] = {list(want)} bool; got {tuple(query_mask.shape)} "
                f"{query_mask.dtype}"
            )
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16 (e.g. 16, 32, 64); got {block_size}")
    devices = {t.device for t in (query, key, value, start, pad, block_index, block_count)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")


def block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    block_index: torch.Tensor,
    block_count: torch.Tensor,
    *,
    block_size: int,
    scale: float | None = None,
    query_mask: torch.Tensor | None = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Block-sparse verify attention over a ``[B, H_kv, C, D]`` cache viewed as blocks of ``block_size`` slots.

    Query ``i`` of row ``b`` (cache slot ``start[b] + i``) attends the slots of its blocks with
    ``pad[b] <= slot <= start[b] + i``. Its blocks: the listed ones (``block_index[b, h, :block_count[b, h]]``,
    strictly ascending, no repeats) plus the forced sink block ``pad[b] // block_size`` and local blocks
    ``start[b] // block_size .. (start[b] + q - 1) // block_size``, which need not be listed; a listed block that
    is also forced is used once (the kernel skips it in the list).

    Shared index (``query_mask=None``): every query and every query head of KV head ``h`` uses the same list.
    Exact merged schedule: the list is the union of the queries' sets and ``query_mask[b, h, i, n]`` says
    whether entry ``n`` belongs to query ``i`` (build both with `merge_query_blocks`); each union block is
    loaded once per (row, KV head) and masked per query.

    Args:
        query: ``[B, H, q, D]`` (views with any strides are fine).
        key, value: ``[B, H_kv, C, D]``, the same dtype as ``query`` (float16, bfloat16 or float32).
        start, pad: ``[B]`` int32/int64; ``pad[b] <= start[b]``.
        block_index: ``[B, H_kv, N]`` int32/int64; entries past ``block_count`` are ignored.
        block_count: ``[B, H_kv]`` int32/int64 (0 = only the forced blocks).
        block_size: a power of two >= 16.
        scale: softmax scale; default ``1 / sqrt(D)``.
        query_mask: ``[B, H_kv, q, N]`` bool, or None for the shared index.
        num_splits: split-K factor over the schedule; 0 = one wave of programs (from shapes only).

    Returns:
        ``[B, q, H, D]`` in ``query.dtype``.

    Example:
        >>> q = torch.randn(1, 4, 2, 16); k = torch.randn(1, 2, 64, 16); v = torch.randn(1, 2, 64, 16)
        >>> start, pad = torch.tensor([62]), torch.tensor([3])
        >>> index = torch.tensor([[[1], [2]]], dtype=torch.int32); count = torch.ones(1, 2, dtype=torch.int32)
        >>> block_sparse_attention(q, k, v, start, pad, index, count, block_size=16).shape
        torch.Size([1, 2, 4, 16])
    """
    _check(query, key, value, start, pad, block_index, block_count, query_mask, block_size)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    return torch.ops.hsv.block_sparse_attention(
        query,
        key,
        value,
        start,
        pad,
        block_index,
        block_count,
        query_mask,
        block_size,
        float(scale),
        num_splits,
    )


def merge_query_blocks(
    query_index: torch.Tensor, query_count: torch.Tensor, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Union of per-query block sets, for the exact merged schedule (plain PyTorch, no host syncs).

    Args:
        query_index: ``[B, H_kv, q, K]`` int block ids of each query (any order; repeats and ids outside
            ``[0, num_blocks)`` are dropped).
        query_count: ``[B, H_kv, q]`` int, the valid prefix of each query's list.
        num_blocks: blocks in the cache (``ceil(C / block_size)``).

    Returns:
        ``block_index`` ``[B, H_kv, N]`` int32 (ascending union, ``N = min(num_blocks, q * K)``, zeros past the
        count), ``block_count`` ``[B, H_kv]`` int32, ``query_mask`` ``[B, H_kv, q, N]`` bool.
    """
    b, h_kv, q_len, k = query_index.shape
    member = selected_block_mask(
        query_index.reshape(b, h_kv * q_len, k),
        query_count.reshape(b, h_kv * q_len),
        num_blocks,
    ).reshape(b, h_kv, q_len, num_blocks)  # [B, H_kv, q, NB]
    union = member.any(dim=2)  # [B, H_kv, NB]
    n = min(num_blocks, q_len * k)
    ids = torch.arange(num_blocks, device=query_index.device)
    order = torch.where(union, ids, num_blocks).sort(dim=-1).values[..., :n]  # [B, H_kv, N]
    valid = order < num_blocks
    block_index = torch.where(valid, order, 0)
    query_mask = (
        member.gather(-1, block_index[:, :, None, :].expand(b, h_kv, q_len, n)) & valid[:, :, None, :]
    )
    return block_index.to(torch.int32), union.sum(-1).to(torch.int32), query_mask
