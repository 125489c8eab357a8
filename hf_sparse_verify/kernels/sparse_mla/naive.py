"""Reference: DeepSeek Sparse Attention over multi-head latent attention (MLA) caches, absorbed, in plain PyTorch
(imports only torch).

MLA caches one latent row per token: ``latent`` (``kv_lora_rank`` channels, the normed compressed KV) and ``rot``
(the rotary key part, shared by all heads). Head ``h``'s key is ``[W_UK[h] latent, rot]`` and its value
``W_UV[h] latent``. With the query's non-rotary part taken through ``W_UK[h]`` first (``q_lat = q_nope W_UK[h]``), the
logit is ``q_lat . latent + q_rot . rot`` and the output ``W_UV[h] (sum_s p_s latent_s)``: every head reads the same
latent rows, and nothing is expanded per head (transformers expands the whole cache through ``kv_b_proj`` at every
step). This folder computes the middle part: ``[B, q, H, R]`` latent outputs.

DSA's indexer picks ``top-k`` slots per query; a verify step's queries pick overlapping sets. The merged schedule
(papers/003) reads the union once: `merged_selection` builds, per row, the sorted union of the queries' allowed
slots (fixed size, padded; a device-side count) and for each union slot a bitmask of the queries that selected it,
with no host synchronisation. The per-query schedule (`per_query_selection`, the default) gives each query its own
list instead.

Example:
    >>> import torch
    >>> indices = torch.tensor([[[3, 1], [1, 4]]])  # one row, two queries, top-2
    >>> allowed = torch.ones(1, 2, 6, dtype=torch.bool)
    >>> slots, bits, count = merged_selection(indices, allowed)
    >>> slots[0, :3].tolist(), bits[0, :3].tolist(), count.tolist()
    ([1, 3, 4], [3, 1, 2], [3])
"""

from __future__ import annotations

import torch

#: verify windows the bitmask of `merged_selection` covers (one bit per query in an int32)
MAX_MERGED_QUERIES = 31
#: query rows per block of the dense reference (bounds its ``[B, H, rows, L]`` float32 logits)
ROW_CHUNK = 16


def selection_mask(indices: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``[B, q, L]`` bool: slot chosen by the query's indexer (``indices`` ``[B, q, k]``) and allowed by the step's
    mask (``allowed`` ``[B, q, L]``); an index past ``L`` is dropped."""
    length = allowed.shape[-1]
    chosen = torch.zeros_like(allowed)
    idx = indices.long()
    chosen.scatter_(-1, idx.clamp(0, length - 1), (idx < length) & (idx >= 0))
    return chosen & allowed


def merged_selection(
    indices: torch.Tensor, allowed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The union of a step's selections, per row: ``(slots [B, U] int32, bits [B, U] int32, count [B] int32)``.

    ``slots[b, :count[b]]`` are the slots some query of row ``b`` both selected and may attend, ascending; bit ``i``
    of ``bits[b, j]`` says query ``i`` selected ``slots[b, j]``. Entries past ``count`` are slot 0 with no bits.
    Eleven small launches and no host synchronisation.
    ``U = min(L, q * k)`` depends on shapes only (a captured graph replays it). At most `MAX_MERGED_QUERIES` queries.
    """
    batch, q_len, length = allowed.shape
    if q_len > MAX_MERGED_QUERIES:
        raise ValueError(
            f"the merged schedule covers up to {MAX_MERGED_QUERIES} queries per step, got {q_len}"
        )
    index = indices.long().clamp(0, length - 1)
    chose = allowed.gather(2, index) & (indices < length) & (indices >= 0)  # [B, q, k]
    shifts = torch.arange(q_len, device=allowed.device, dtype=torch.int32)[None, :, None]
    per_slot = torch.zeros(batch, length, dtype=torch.int32, device=allowed.device)
    per_slot.scatter_add_(
        1, index.view(batch, -1), (chose.int() << shifts).view(batch, -1)
    )  # distinct bits: OR
    taken = per_slot != 0
    width = min(length, q_len * indices.shape[-1])
    position = torch.where(taken, taken.cumsum(-1) - 1, width)  # slots no query chose go to a spare column
    slots = torch.zeros(batch, width + 1, dtype=torch.int32, device=allowed.device)
    slots.scatter_(
        1, position, torch.arange(length, device=allowed.device, dtype=torch.int32).expand(batch, -1)
    )
    bits = torch.zeros_like(slots).scatter_(1, position, per_slot)
    return slots[:, :width], bits[:, :width], taken.sum(-1, dtype=torch.int32)


def per_query_selection(
    indices: torch.Tensor, allowed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-query schedule's selection: each query of each row its own list, the indexer's slots as they come (the
    kernel does not need them sorted), bit 0 where the step's mask allows the slot. ``[B * q, k]``, ``[B * q, k]``,
    ``[B * q]`` (row ``b * q + i``: query ``i`` of row ``b``), for `kernel.sparse_mla_triton` with ``kv_share=q``."""
    batch, q_len, top_k = indices.shape
    length = allowed.shape[-1]
    index = indices.long().clamp(0, length - 1)
    chose = allowed.gather(2, index) & (indices < length) & (indices >= 0)
    count = torch.full((batch * q_len,), top_k, dtype=torch.int32, device=indices.device)
    return index.int().view(batch * q_len, top_k), chose.int().view(batch * q_len, top_k), count


def sparse_mla_naive(
    q_lat: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, rot: torch.Tensor, attend: torch.Tensor,
    scaling: float,
) -> torch.Tensor:  # fmt: skip
    """Absorbed MLA attention: ``q_lat`` ``[B, q, H, R]``, ``q_rot`` ``[B, q, H, P]``, ``latent`` ``[B, L, R]``,
    ``rot`` ``[B, L, P]``, ``attend`` ``[B, q, L]`` bool (`selection_mask`). Logits and softmax in float32; a query
    that attends nothing gets zeros. Returns ``[B, q, H, R]`` in ``q_lat.dtype``."""
    length = attend.shape[-1]
    lat, pos = latent[:, :length].float(), rot[:, :length].float()
    outs = []
    for i in range(0, q_lat.shape[1], ROW_CHUNK):
        ql, qr = q_lat[:, i : i + ROW_CHUNK].float(), q_rot[:, i : i + ROW_CHUNK].float()
        logits = (torch.einsum("bqhr,blr->bqhl", ql, lat) + torch.einsum("bqhp,blp->bqhl", qr, pos)) * scaling
        mask = attend[:, i : i + ROW_CHUNK, None, :]
        logits = logits.masked_fill(~mask, float("-inf"))
        top = logits.amax(-1, keepdim=True)
        weights = torch.exp(logits - torch.where(torch.isinf(top), 0.0, top))
        total = weights.sum(-1, keepdim=True)
        probs = weights / torch.where(total > 0, total, 1.0)
        outs.append(torch.einsum("bqhl,blr->bqhr", probs, lat))
    return torch.cat(outs, dim=1).to(q_lat.dtype)


def selected_attention_expanded(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attend: torch.Tensor, scaling: float
) -> torch.Tensor:
    """The same attention on expanded per-head keys and values (``query`` ``[B, H, q, D_k]``, ``key`` ``[B, H, L,
    D_k]``, ``value`` ``[B, H, L, D_v]``, ``attend`` ``[B, q, L]``), as transformers computes it: the path for long
    query blocks (prefill chunks), where absorbing ``W_UK`` into every query costs more than expanding the cache
    once. Logits and softmax in float32; a query that attends nothing gets zeros. Returns ``[B, q, H, D_v]``."""
    outs = []
    for i in range(0, query.shape[2], ROW_CHUNK):
        logits = torch.matmul(query[:, :, i : i + ROW_CHUNK].float(), key.float().transpose(-1, -2)) * scaling
        mask = attend[:, None, i : i + ROW_CHUNK]
        logits = logits.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)
        outs.append(torch.matmul(probs, value.float()))
    return torch.cat(outs, dim=2).transpose(1, 2).to(query.dtype)
