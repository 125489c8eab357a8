"""Triton cache write: keys and values of a step in one launch (eager: two scatter kernels per layer)."""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton import next_power_of_2, on_input_device, pdl_launch, pdl_wait


@triton.jit
def _cache_write_kernel(
    KC, VC, K, V, SLOTS,
    q_len, kv_heads,
    s_kcb, s_kch, s_kct, s_vcb, s_vch, s_vct,
    s_kb, s_kh, s_kt, s_vb, s_vh, s_vt,
    s_sb,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    bh = tl.program_id(0)
    i = tl.program_id(1)
    b = (bh // kv_heads).to(tl.int64)
    h = bh % kv_heads
    slot = tl.load(SLOTS + b * s_sb + i).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    ok = offs < HEAD_DIM
    b_k = tl.load(K + b * s_kb + h * s_kh + i * s_kt + offs, mask=ok)
    b_v = tl.load(V + b * s_vb + h * s_vh + i * s_vt + offs, mask=ok)
    tl.store(KC + b * s_kcb + h * s_kch + slot * s_kct + offs, b_k.to(KC.dtype.element_ty), mask=ok)
    tl.store(VC + b * s_vcb + h * s_vch + slot * s_vct + offs, b_v.to(VC.dtype.element_ty), mask=ok)


@on_input_device
def launch(key_cache, value_cache, key, value, slots) -> None:
    batch, kv_heads, q_len, dim = key.shape
    _cache_write_kernel[(batch * kv_heads, q_len)](
        key_cache, value_cache, key, value, slots,
        q_len, kv_heads,
        *key_cache.stride()[:3], *value_cache.stride()[:3],
        *key.stride()[:3], *value.stride()[:3],
        slots.stride(0),
        HEAD_DIM=dim, BLOCK_D=next_power_of_2(dim), num_warps=1,
        **pdl_launch(key_cache.device),
    )  # fmt: skip
