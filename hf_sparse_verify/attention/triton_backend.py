"""The ``"triton"`` attention backend: decode and verify steps (up to 128 / group new tokens per row: 32 for
Llama-3-8B) run the split-KV decode-attention kernel over the whole preallocated cache, reading each row's valid
range from the device-side ``start``/``pad``. It never looks at the host-side ``kv_len``, so a step is the same
work whatever the lengths are, which is what lets the loop capture steps in CUDA graphs and replay them at any
length.

Vegas score collection (first and last rows, or all rows; softmax weights or raw logits) is fused into the same
kernel. Draft steps with an index selection run the token-sparse kernel; prefill and other steps go to the
``token_sparse``/``reference`` backends.

The decode-attention kernel also applies logit soft-capping (Gemma 2/3, Cohere 2) and per-head sink logits
(GPT-OSS), so those layers' decode and verify steps run it too; their prefill and self-speculative draft steps run
the reference backend (the token-sparse kernel computes plain softmax). Layers whose value head size differs from
the key's (multi-head latent attention: DeepSeek V2/V3, MiniCPM3) run the reference backend at every step. The
reference backend is exact, slower, and capturable in CUDA graphs like the rest (it reads the same device-side
slots and never syncs).
"""

from __future__ import annotations

import torch

from ..kernels.decode_attention import decode_attention
from ..kernels.decode_attention.op import MAX_ROWS
from ..kernels.token_sparse import token_sparse_attention as token_sparse_kernel
from ..step import DeviceView, Phase
from .dispatch import register_backend
from .eager import PLAIN, LogitMods, reference_attention
from .token_sparse import token_sparse_attention


@register_backend("triton")
def triton_attention(
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
    """As `reference_attention` (``query`` ``[B, H, q, D]``, cache ``[B, H_kv, C, D]``; returns ``[B, q, H, D]``)."""
    step = view.step
    layer = module.layer_idx
    selection = step.draft_selection()
    too_many_rows = step.q_len * (query.shape[1] // key.shape[1]) > MAX_ROWS
    if (
        key.shape[-1] != value.shape[-1]
        or mods.alibi is not None  # no kernel adds position biases
        or (not mods.plain and (step.phase is Phase.PREFILL or too_many_rows or selection is not None))
    ):
        return reference_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window, mods=mods
        )
    if step.phase is Phase.PREFILL or too_many_rows:
        return token_sparse_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window
        )
    if selection is not None:
        gathered = selection.gather_index(layer, query) if not sliding_window else None
        if gathered is None or gathered[0].dim() != 2:  # mask-only or per-KV-head selections: reference path
            return token_sparse_attention(
                module, query, key, value, view, scaling=scaling, sliding_window=sliding_window
            )
        index, count = gathered
        return token_sparse_kernel(
            query, key, value, index, count, selection.recent_start(layer), view.start, scaling
        )
    collection = step.score_collection()
    if collection is not None and collection.rows == "per_row":
        return token_sparse_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window
        )
    out, scores = decode_attention(
        query,
        key,
        value,
        view.start,
        view.pad,
        scaling,
        window=int(sliding_window or 0),
        collect=collection.rows if collection is not None else None,
        weights=collection is not None and collection.weights,
        per_kv_head=collection is not None and collection.per_kv_head,
        softcap=mods.softcap or 0.0,
        sinks=mods.sinks,
        carried_lse=collection.carried_lse(layer) if collection is not None else None,
    )
    if collection is not None:
        collection.write(layer, scores)
    return out
