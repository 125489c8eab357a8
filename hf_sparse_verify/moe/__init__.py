"""Mixture-of-experts support: the decoding-time experts implementation (`experts_for_decoding`), which on CUDA is
our fused Triton experts registered with transformers' experts interface (`fused`, ``"hsv_fused"``). Expert skipping
for sparse verification plugs into the same op through its per-token expert count (``n_active``)."""

from .experts import decoding_implementation, experts_for_decoding
from .fused import NAME as FUSED_EXPERTS
from .fused import fused_experts_forward, supports

__all__ = [
    "FUSED_EXPERTS",
    "decoding_implementation",
    "experts_for_decoding",
    "fused_experts_forward",
    "supports",
]
