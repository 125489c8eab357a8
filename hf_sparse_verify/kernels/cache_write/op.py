"""``hsv::cache_write``: validation, registration with ``torch.library`` (mutating both caches), Triton where it
runs, reference elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import cache_write_naive


@torch.library.custom_op("hsv::cache_write", mutates_args=("key_cache", "value_cache"))
def _cache_write_op(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    if triton_runs_on(key_cache.device) and key_cache.dtype != torch.float64:
        from .kernel import launch

        launch(key_cache, value_cache, key, value, slots)
    else:
        cache_write_naive(key_cache, value_cache, key, value, slots)


@_cache_write_op.register_fake
def _(key_cache, value_cache, key, value, slots) -> None:
    return None


def cache_write(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Write ``key``/``value`` ``[B, H_kv, q, D]`` into ``key_cache``/``value_cache`` ``[B, H_kv, C, D]`` at
    ``slots`` ``[B, q]`` (slot of each row's new tokens), in place, in one launch.

    Example:
        >>> kc, vc = torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 6, 4)
        >>> cache_write(kc, vc, torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4), torch.tensor([[2, 3]]))
        >>> kc[0, 0, :, 0].tolist()
        [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    """
    if key.shape != value.shape or key_cache.shape != value_cache.shape or key.dim() != 4:
        raise ValueError(
            f"cache_write needs key/value [B, H_kv, q, D] and caches [B, H_kv, C, D] of equal shapes; got "
            f"{tuple(key.shape)}, {tuple(value.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}"
        )
    if key.shape[:2] != key_cache.shape[:2] or key.shape[3] != key_cache.shape[3]:
        raise ValueError(f"new keys {tuple(key.shape)} do not match the cache {tuple(key_cache.shape)}")
    if slots.shape != (key.shape[0], key.shape[2]):
        raise ValueError(f"slots must be [B, q] = {(key.shape[0], key.shape[2])}, got {tuple(slots.shape)}")
    if (
        key.stride(-1) != 1
        or value.stride(-1) != 1
        or key_cache.stride(-1) != 1
        or value_cache.stride(-1) != 1
    ):
        raise ValueError("keys, values and caches must be contiguous in the last dimension (head_dim)")
    torch.ops.hsv.cache_write(key_cache, value_cache, key, value, slots)
