"""Routed SwiGLU experts of a MoE layer in four graph-capturable launches that read each selected expert once."""

from .naive import active_pairs, fused_experts_naive
from .op import fused_experts

__all__ = ["active_pairs", "fused_experts", "fused_experts_naive"]
