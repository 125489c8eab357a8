"""Plain-PyTorch reference of multi-query decode attention over a cache (the definition the kernel is tested
against).

Row ``b`` has ``q`` new tokens; query ``i`` sits at cache slot ``start[b] + i`` (its key/value already written) and
attends to slots ``j`` with ``pad[b] <= j <= start[b] + i`` and, on a sliding layer, ``j > start[b] + i - window``.
A query always attends to its own slot (so a query inside the padding still has a finite softmax).
"""

from __future__ import annotations

import torch


def attention_mask(
    start: torch.Tensor, pad: torch.Tensor, q_len: int, capacity: int, window: int = 0
) -> torch.Tensor:
    """``[B, q, C]`` bool: which cache slot each new token may attend to."""
    slots = torch.arange(capacity, device=start.device)  # [C]
    own = start[:, None] + torch.arange(q_len, device=start.device)  # [B, q]
    mask = (slots <= own[:, :, None]) & (slots >= pad[:, None, None])
    if window:
        mask &= slots > own[:, :, None] - window
    return mask | (slots == own[:, :, None])


def score_rows(q_len: int, collect: str) -> list[int]:
    """Query rows whose logits enter the collected scores: ``"two_rows"`` = first and last, ``"all_rows"``."""
    if collect == "two_rows":
        return [0, q_len - 1] if q_len > 1 else [0]
    if collect == "all_rows":
        return list(range(q_len))
    raise ValueError(f"collect must be 'two_rows' or 'all_rows', got {collect!r}")


def scored_range(start: torch.Tensor, pad: torch.Tensor, q_len: int, window: int) -> tuple[torch.Tensor, ...]:
    """``[lo, hi)`` per row: the slots the kernel reads (and scores); scores outside are 0."""
    lo = pad.clone()
    if window:
        lo = torch.maximum(lo, start - window + 1)
    return torch.minimum(lo, start), start + q_len


def decode_attention_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    scale: float,
    window: int = 0,
    collect: str | None = None,
    weights: bool = False,
    per_kv_head: bool = False,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    carried_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference attention of ``q`` new tokens per row over the cache, in float32 (float64 inputs stay float64).

    Args:
        query: ``[B, H, q, D]``.
        key, value: ``[B, H_kv, C, D]`` cache buffers (``H % H_kv == 0``).
        start, pad: ``[B]`` int, slot of each row's first new token and its left padding.
        scale: softmax scale.
        window: sliding window (0 = none).
        collect: None, ``"two_rows"`` or ``"all_rows"``: also return scores ``[B, C]``, the raw logits
            ``q . k * scale`` averaged over all query heads and the chosen rows, on the slots ``[lo, hi)`` of
            `scored_range` (0 elsewhere).
        weights: score by the softmax weights ``exp(logit - lse)`` of the chosen rows instead (0 where a row
            may not attend).
        per_kv_head: return ``[B, H_kv, C]``, the mean over each KV head's query heads, instead of all heads.
        softcap: logit soft-capping ``softcap * tanh(logit / softcap)`` before masking (Gemma 2, Cohere 2); 0 for
            none. Collected scores are the capped logits (or their softmax weights).
        sinks: ``[H]`` per-head sink logit joining each softmax denominator and attending to nothing (GPT-OSS).
            Collected weights are those of the softmax over the cached slots alone (as the reference backend's).
        carried_lse: ``[B, H]`` float32 (with ``weights``): the weights are ``exp(logit - carried_lse[b, h])``
            instead of each row's softmax; afterwards ``carried_lse`` holds the first row's log-sum-exp (in place).

    Returns:
        ``([B, q, H, D]`` in ``query.dtype``, scores or None).
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, capacity = key.shape[1], key.shape[2]
    group = heads // kv_heads
    work = torch.float64 if query.dtype == torch.float64 else torch.float32
    k = key.to(work).repeat_interleave(group, dim=1)  # [B, H, C, D]
    v = value.to(work).repeat_interleave(group, dim=1)
    logits = torch.matmul(query.to(work), k.transpose(-1, -2)) * scale  # [B, H, q, C]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    mask = attention_mask(start, pad, q_len, capacity, window)[:, None]  # [B, 1, q, C]
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    attend = probs
    if sinks is not None:  # one more logit per head in the denominator
        masked = logits.masked_fill(~mask, float("-inf"))
        sink = sinks.to(work)[None, :, None, None].expand(batch, heads, q_len, 1)
        attend = torch.softmax(torch.cat([masked, sink], dim=-1), dim=-1)[..., :capacity]
    out = torch.matmul(attend, v).transpose(1, 2).to(query.dtype)  # [B, q, H, D]
    if collect is None:
        return out, None
    rows = score_rows(q_len, collect)
    if weights and carried_lse is not None:
        masked = logits.masked_fill(~mask, float("-inf"))
        values = torch.exp(masked - carried_lse.to(work)[:, :, None, None])
        carried_lse.copy_(torch.logsumexp(masked[:, :, 0], dim=-1))
    else:
        values = probs if weights else logits
    chosen = values[:, :, rows].mean(dim=2)  # [B, H, C]
    scores = chosen.view(batch, kv_heads, group, capacity).mean(dim=2)  # [B, H_kv, C]
    if not per_kv_head:
        scores = scores.mean(dim=1)  # [B, C]
    lo, hi = scored_range(start, pad, q_len, window)
    slots = torch.arange(capacity, device=query.device)
    inside = (slots[None, :] >= lo[:, None]) & (slots[None, :] < hi[:, None])  # [B, C]
    if per_kv_head:
        inside = inside[:, None, :]
    return out, torch.where(inside, scores, torch.zeros_like(scores)).float()
