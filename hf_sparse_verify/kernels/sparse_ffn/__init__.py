"""Gated MLP of decode and verify steps: the fused dense ``silu(gate) * up`` (`gated_act`) and the sparse FFN of
verification (the sparse-verification paper §3.4: `sparse_ffn`, or its halves `sparse_gate_up` + `masked_down`, reading only the rows of
up and down that some row keeps)."""

from .naive import (
    channel_mask_naive,
    gated_act_naive,
    masked_down_naive,
    sparse_gate_up_naive,
    sparse_mlp_naive,
)
from .op import gated_act, masked_down, sparse_ffn, sparse_gate_up

__all__ = [
    "channel_mask_naive",
    "gated_act",
    "gated_act_naive",
    "masked_down",
    "masked_down_naive",
    "sparse_ffn",
    "sparse_gate_up",
    "sparse_gate_up_naive",
    "sparse_mlp_naive",
]
