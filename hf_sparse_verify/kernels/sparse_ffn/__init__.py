"""Gated MLP of decode and verify steps: the fused dense ``silu(gate) * up`` (`gated_act`) and the sparse FFN of
verification (papers/000 §3.4: `kept_channels` + `sparse_up_down`, reading only the kept rows of up and down)."""

from .naive import (
    channel_mask_naive,
    compact_naive,
    gated_act_naive,
    kept_mask_naive,
    sparse_mlp_naive,
    sparse_up_down_naive,
)
from .op import gate_activations, gated_act, kept_channels, sparse_ffn, sparse_up_down

__all__ = [
    "channel_mask_naive",
    "compact_naive",
    "gate_activations",
    "gated_act",
    "gated_act_naive",
    "kept_channels",
    "kept_mask_naive",
    "sparse_ffn",
    "sparse_mlp_naive",
    "sparse_up_down",
    "sparse_up_down_naive",
]
