"""Gather-based token-sparse attention for self-speculative draft steps (plain PyTorch).

A draft step reads only the selected prefix slots (gathered by index) and the slots appended since the selection,
instead of masking the whole cache: the bytes moved scale with the selection, not the context. Every other case
(verify, prefill, sliding-window layers, per-step Quest selection, no selection) goes to the reference backend.
Tested against the reference backend; a Triton kernel can later replace the gather + SDPA pair.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import register_backend
from .reference import reference_attention
from .selection import SparseLayerState
from .step import DeviceView


@register_backend("token_sparse")
def token_sparse_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    view: DeviceView,
    *,
    scaling: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """As `reference_attention`; draft steps with an index selection attend to ``index`` + recent slots only.

    Shapes: ``query`` ``[B, H, q, D]``, ``key``/``value`` ``[B, H_kv, capacity, D]``; returns ``[B, q, H, D]``.
    """
    step = view.step
    state: SparseLayerState | None = step.layer_state(module.layer_idx)
    if step.phase != "draft" or state is None or state.index is None or sliding_window:
        return reference_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window
        )
    batch, kv_heads, _, dim = key.shape
    k_max = state.index.shape[1]
    gather_index = state.index[:, None, :, None].expand(batch, kv_heads, k_max, dim)
    recent_lo = state.recent_min
    keys = torch.cat([key.gather(2, gather_index), key[:, :, recent_lo : step.kv_len]], dim=2)
    values = torch.cat([value.gather(2, gather_index), value[:, :, recent_lo : step.kv_len]], dim=2)
    recent_slots = torch.arange(recent_lo, step.kv_len, device=query.device)  # [R]
    recent_ok = (recent_slots[None, None, :] >= state.recent_start[:, None, None]) & (
        recent_slots[None, None, :] <= view.query_slots[:, :, None]
    )  # [B, q, R]
    chosen_ok = state.index_valid[:, None, :].expand(batch, step.q_len, k_max)
    mask = torch.cat([chosen_ok, recent_ok], dim=-1)[:, None]  # [B, 1, q, k_max + R]
    gqa = query.shape[1] != kv_heads
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()
