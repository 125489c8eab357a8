"""The ``"triton"`` attention backend: decode and verify steps (up to 128 / group new tokens per row: 32 for Llama-3-8B) run the split-KV
decode-attention kernel over the whole preallocated cache, reading each row's valid range from the device-side
``start``/``pad``. It never looks at the host-side ``kv_len``, so a step is the same work whatever the lengths
are, which is what lets the loop capture steps in CUDA graphs and replay them at any length.

Vegas score collection (``collect`` of ``"two_rows"``/``"all_rows"``) is fused into the same kernel. Draft steps
with a token selection, prefill chunks and longer steps go to the ``token_sparse`` backend (gather) or the
``reference`` one.
"""

from __future__ import annotations

import torch

from ..kernels.decode_attention import decode_attention
from ..kernels.decode_attention.op import MAX_ROWS
from ..kernels.token_sparse import token_sparse_attention as token_sparse_kernel
from .dispatch import register_backend
from .selection import SparseLayerState
from .step import DeviceView
from .token_sparse import token_sparse_attention

_FUSED_COLLECT = (None, "two_rows", "all_rows")


def uses_kernel(phase: str, q_len: int, group: int, state: SparseLayerState | None) -> bool:
    """Whether a step of ``q_len`` new tokens in ``phase`` (``group`` query heads per KV head) with layer
    ``state`` runs the decode kernel."""
    if phase == "prefill" or q_len * group > MAX_ROWS:
        return False
    if state is None:
        return True
    if phase == "verify":
        return state.collect in _FUSED_COLLECT
    return state.selected is None and state.quest_budget is None  # a draft step without a selection: dense


def uses_token_sparse_kernel(phase: str, state: SparseLayerState | None, sliding_window: int | None) -> bool:
    """Draft steps with an index selection (Vegas, StreamingLLM) on full-attention layers."""
    return phase == "draft" and state is not None and state.index_count is not None and not sliding_window


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
) -> torch.Tensor:
    """As `reference_attention` (``query`` ``[B, H, q, D]``, cache ``[B, H_kv, C, D]``; returns ``[B, q, H, D]``)."""
    step = view.step
    state: SparseLayerState | None = step.layer_state(module.layer_idx)
    if uses_token_sparse_kernel(step.phase, state, sliding_window):
        return token_sparse_kernel(
            query, key, value, state.index, state.index_count, state.recent_start, view.start, scaling
        )
    if not uses_kernel(step.phase, step.q_len, query.shape[1] // key.shape[1], state):
        return token_sparse_attention(
            module, query, key, value, view, scaling=scaling, sliding_window=sliding_window
        )
    collect = state.collect if state is not None and step.phase == "verify" else None
    out, scores = decode_attention(
        query, key, value, view.start, view.pad, scaling, window=int(sliding_window or 0), collect=collect
    )
    if collect is not None:
        state.scores = scores
    return out
