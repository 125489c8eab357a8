"""Gather-based token-sparse attention for self-speculative draft steps (plain PyTorch).

A draft step reads only the selected prefix slots (gathered by index) and the slots appended since the selection,
instead of masking the whole cache: the bytes moved scale with the selection, not the context. Every other case
(verify, prefill, sliding-window layers, mask-only selections such as Quest's) goes to the reference backend.
Tested against the reference backend; the Triton backend runs the ``token_sparse`` kernel instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..step import DeviceView
from .dispatch import register_backend
from .eager import PLAIN, LogitMods, reference_attention


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
    mods: LogitMods = PLAIN,
) -> torch.Tensor:
    """As `reference_attention`; draft steps with an index selection attend to ``index`` + recent slots only.
    Layers with soft-capping or sinks (``mods``) go to the reference backend.

    Shapes: ``query`` ``[B, H, q, D]``, ``key`` ``[B, H_kv, capacity, D]``, ``value`` ``[B, H_kv, capacity, D_v]``;
    returns ``[B, q, H, D_v]``.
    """
    step = view.step
    selection = step.draft_selection()
    gathered = (
        selection.gather_index(module.layer_idx, query)
        if selection is not None and not sliding_window and mods.plain
        else None
    )
    if gathered is None or gathered[0].dim() != 2:
        return reference_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window, mods=mods
        )
    index, count = gathered  # [B, k_max], [B]
    recent_start = selection.recent_start(module.layer_idx)  # [B]
    batch, kv_heads = key.shape[:2]
    k_max = index.shape[1]
    slots = index[:, None, :, None]  # [B, 1, k_max, 1]
    key_index = slots.expand(batch, kv_heads, k_max, key.shape[-1])
    value_index = slots.expand(batch, kv_heads, k_max, value.shape[-1])
    recent_lo = min(selection.recent_min, step.kv_len)  # host-side lower bound of every row's recent_start
    keys = torch.cat([key.gather(2, key_index), key[:, :, recent_lo : step.kv_len]], dim=2)
    values = torch.cat([value.gather(2, value_index), value[:, :, recent_lo : step.kv_len]], dim=2)
    recent_slots = torch.arange(recent_lo, step.kv_len, device=query.device)  # [R]
    recent_ok = (recent_slots[None, None, :] >= recent_start[:, None, None]) & (
        recent_slots[None, None, :] <= view.query_slots[:, :, None]
    )  # [B, q, R]
    chosen_ok = (torch.arange(k_max, device=query.device)[None, :] < count[:, None])[:, None, :]
    mask = torch.cat([chosen_ok.expand(batch, step.q_len, k_max), recent_ok], dim=-1)[:, None]
    gqa = query.shape[1] != kv_heads
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous()
