"""References: transformers' Llama-family attention arithmetic up to the cache update (``q_proj``/``k_proj``/``v_proj``
as ``F.linear``; Qwen3's per-head ``q_norm``/``k_norm`` RMSNorm; ``apply_rotary_pos_emb`` with ``rotate_half``), one
eager op at a time, so every rounding to the activation dtype happens where transformers rounds."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..rms_norm.naive import rms_norm_naive


def qkv_proj_naive(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_q: torch.Tensor | None = None,
    b_k: torch.Tensor | None = None,
    b_v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` ``[T, H]``, ``w_*`` ``[N_*, H]``, optional biases ``[N_*]`` -> ``F.linear`` of each, ``[T, N_*]``."""
    return F.linear(x, w_q, b_q), F.linear(x, w_k, b_k), F.linear(x, w_v, b_v)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(x_lo, x_hi) -> (-x_hi, x_lo)`` over the last dimension (transformers' ``rotate_half``)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_qk_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` ``[T, Hq * D]``, ``k`` ``[T, Hkv * D]``, ``cos`` / ``sin`` ``[T, D]`` -> rotated ``[T, Hq, D]`` and
    ``[T, Hkv, D]``: optional per-head RMSNorm (weights ``[D]``), then ``x * cos + rotate_half(x) * sin``."""
    q = q.view(q.shape[0], -1, head_dim)
    k = k.view(k.shape[0], -1, head_dim)
    if q_norm_weight is not None:
        q = rms_norm_naive(q, q_norm_weight, eps)
    if k_norm_weight is not None:
        k = rms_norm_naive(k, k_norm_weight, eps)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)
