"""Plain-PyTorch reference attention over a `SpecCache`: dense, exact, GQA-aware, sliding-window aware.

Every faster or sparser backend is tested against this one, and this one against transformers' own attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import register_backend
from .step import DeviceView


@register_backend("reference")
def reference_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    view: DeviceView,
    *,
    scaling: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Attention of ``q`` new tokens per row over the valid cache slots.

    Args:
        query: ``[B, H, q, D]``.
        key, value: ``[B, H_kv, capacity, D]`` cache buffers, ``H % H_kv == 0``.
        view: the step's tensors on this device (slots, masks).
        scaling: softmax scale.
        sliding_window: window of a sliding-attention layer, or None.

    Returns:
        ``[B, q, H, D]``, the layout transformers' attention functions return.
    """
    kv_len = view.step.kv_len
    key = key[:, :, :kv_len]  # [B, H_kv, L, D]
    value = value[:, :, :kv_len]
    gqa = query.shape[1] != key.shape[1]
    if view.is_plain_causal(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    elif view.is_full_row(sliding_window):
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=gqa)
    else:
        mask = view.mask(sliding_window)  # [B, 1, q, L]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()
