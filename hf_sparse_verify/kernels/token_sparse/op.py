"""Public token-sparse attention op, registered as ``hsv::token_sparse_attention`` (opaque to graph capture)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import token_sparse_attention_naive

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_INTS = (torch.int32, torch.int64)


@torch.library.custom_op("hsv::token_sparse_attention", mutates_args=())
def _token_sparse_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    index_count: torch.Tensor,
    recent_start: torch.Tensor,
    start: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    if triton_runs_on(query.device):
        from .kernel import token_sparse_attention_triton

        return token_sparse_attention_triton(
            query, key, value, index, index_count, recent_start, start, scale
        )
    return token_sparse_attention_naive(query, key, value, index, index_count, recent_start, start, scale)


@_token_sparse_op.register_fake
def _(query, key, value, index, index_count, recent_start, start, scale):
    batch, heads, q_len, dim = query.shape
    return query.new_empty(batch, q_len, heads, dim)


def _check(query, key, value, index, index_count, recent_start, start) -> None:
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(
            f"query must be [B, H, q, D] and key/value [B, H_kv, C, D]; got query {tuple(query.shape)}, "
            f"key {tuple(key.shape)}"
        )
    if value.shape != key.shape:
        raise ValueError(f"value {tuple(value.shape)} must have the shape of key {tuple(key.shape)}")
    batch, heads, _, dim = query.shape
    if key.shape[0] != batch or key.shape[3] != dim:
        raise ValueError(
            f"key/value {tuple(key.shape)} must share batch and head_dim with query {tuple(query.shape)}"
        )
    if heads % key.shape[1] != 0:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({key.shape[1]})")
    if query.dtype not in _FLOATS or key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(
            f"query/key/value must share one dtype of float16, bfloat16, float32; got {query.dtype}, "
            f"{key.dtype}, {value.dtype}"
        )
    if index.dim() != 2 or index.shape[0] != batch or index.dtype not in _INTS:
        raise ValueError(
            f"index must be [B={batch}, N] int32 or int64; got {tuple(index.shape)} {index.dtype}"
        )
    for name, t in (("index_count", index_count), ("recent_start", recent_start), ("start", start)):
        if t.shape != (batch,) or t.dtype not in _INTS:
            raise ValueError(f"{name} must be [B={batch}] int32 or int64; got {tuple(t.shape)} {t.dtype}")
    tensors = (key, value, index, index_count, recent_start, start)
    if any(t.device != query.device for t in tensors):
        raise ValueError(f"all inputs must be on query's device {query.device}")


def token_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    index_count: torch.Tensor,
    recent_start: torch.Tensor,
    start: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of draft queries to selected prefix slots plus the recent slots (self-speculative drafting).

    Query ``i`` of row ``b`` (cache slot ``start[b] + i``) attends to ``index[b, :index_count[b]]`` and to the
    slots ``recent_start[b] <= j <= start[b] + i``; a query that attends to nothing gets zeros. Reads only those
    K/V rows: the bytes moved scale with the selection, not the context.

    Args:
        query: ``[B, H, q, D]`` float16/bfloat16/float32 (any strides).
        key, value: ``[B, H_kv, C, D]`` cache buffers, ``H`` a multiple of ``H_kv`` (GQA).
        index: ``[B, N]`` int32/int64, ascending selected slots, each ``< recent_start[b]`` (entries past
            ``index_count[b]`` are ignored), shared by all heads.
        index_count: ``[B]`` valid entries of ``index`` per row (clamped to ``[0, N]``).
        recent_start: ``[B]`` first always-attended slot.
        start: ``[B]`` slot of query 0; ``start[b] + q - 1 < C``.
        scale: softmax scale.

    Returns:
        ``[B, q, H, D]`` in ``query.dtype``.

    Example:
        >>> q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 10, 16)
        >>> out = token_sparse_attention(q, k, k, torch.tensor([[0, 3]]), torch.tensor([2]),
        ...                              torch.tensor([8]), torch.tensor([9]), 0.25)
        >>> out.shape
        torch.Size([1, 1, 4, 16])
    """
    _check(query, key, value, index, index_count, recent_start, start)
    return torch.ops.hsv.token_sparse_attention(
        query, key, value, index, index_count, recent_start, start, float(scale)
    )
