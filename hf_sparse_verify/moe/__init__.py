"""Mixture-of-experts support: the decoding-time experts implementation (`experts_for_decoding`), which on CUDA is
our fused Triton experts registered with transformers' experts interface (`fused`, ``"hsv_fused"``). Expert skipping
for sparse verification (`hf_sparse_verify.sparse.moe`) plugs into the same op through its per-token expert count
(``n_active``); ``experts_for_decoding(model, expert_skipping=True)`` puts every experts block on ``"hsv_fused"``,
also on CPU, so that verify steps' `MoESkip` applies."""

from .experts import decoding_implementation, experts_for_decoding
from .fused import NAME as FUSED_EXPERTS
from .fused import fused_experts_forward, record_layers, supports

__all__ = [
    "FUSED_EXPERTS",
    "decoding_implementation",
    "experts_for_decoding",
    "fused_experts_forward",
    "record_layers",
    "supports",
]
