"""Reference cache write: new keys and values of each row go to that row's slots (two scatters)."""

from __future__ import annotations

import torch


def cache_write_naive(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """``key_cache[b, h, slots[b, i]] = key[b, h, i]`` (and values), in place; caches ``[B, H_kv, C, D]``, new
    ``[B, H_kv, q, D]``, ``slots`` ``[B, q]``."""
    index = slots[:, None, :, None].expand(*key.shape)
    key_cache.scatter_(2, index, key.to(key_cache.dtype))
    value_cache.scatter_(2, index, value.to(value_cache.dtype))
