"""Attention scores for verification-guided KV selection (Vegas), reduced from one step's attention.

The signal per cached slot is the attention of the collected query rows, averaged over rows and over query heads
(or over the query heads of each KV head). Two kinds: raw logits ``q . k * scale`` (the paper's text), or softmax
weights ``exp(logit - lse)`` (the released Vegas code: normalising makes heads with different logit spreads
comparable). Plain PyTorch; the Triton verify kernel computes the same quantity fused (``kernels/decode_attention``).
"""

from __future__ import annotations

import torch

from ..step import ScoreCollection


def collected_rows(q_len: int, rows: str) -> slice:
    """Query rows a verify step of ``q_len`` tokens reduces: first and last (``"two_rows"``) or all, as a slice
    (indexing with a list would copy a host index tensor to the device: a sync, and an error inside CUDA-graph
    capture).

    Example:
        >>> list(range(7))[collected_rows(7, "two_rows")], list(range(1))[collected_rows(1, "two_rows")]
        ([0, 6], [0])
    """
    if rows == "two_rows":
        return slice(0, q_len, q_len - 1) if q_len > 1 else slice(0, 1)
    return slice(None)


def reduce_scores(
    logits: torch.Tensor,
    mask: torch.Tensor,
    collection: ScoreCollection,
    kv_heads: int,
    per_row: bool = False,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scores from the logits of the collected rows.

    Args:
        logits: ``[B, H, R, L]`` float32 raw logits ``q . k * scale`` of the collected rows.
        mask: ``[B, 1 or H, R, L]`` bool, where those rows may attend (the softmax support for weights).
        collection: says weights or logits, and per KV head or over all heads.
        kv_heads: KV heads (query heads ``h`` belong to KV head ``h // (H / kv_heads)``).
        per_row: keep the row axis (``"per_row"`` collection).
        lse: ``[B, H]`` float32, the carried log-sum-exp (``collection.lse == "carried"``): weights are
            ``exp(logit - lse)`` with this normaliser instead of each row's own softmax.

    Returns:
        ``[B, L]`` (``[B, H_kv, L]`` per KV head; ``[B, R, L]`` with ``per_row``), float32.
    """
    batch, heads, rows, length = logits.shape
    if lse is not None:
        values = torch.exp(logits.masked_fill(~mask, float("-inf")) - lse[:, :, None, None])
    elif collection.weights:
        values = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    else:
        values = logits
    if per_row:
        return values.mean(dim=1)  # [B, R, L]
    values = values.mean(dim=2)  # [B, H, L]
    if collection.per_kv_head:
        return values.view(batch, kv_heads, heads // kv_heads, length).mean(dim=2)
    return values.mean(dim=1)
