"""MoE top-k router (logits, softmax, top-k, renormalization) in one graph-capturable launch."""

from .naive import moe_router_naive, route_from_logits
from .op import moe_router

__all__ = ["moe_router", "moe_router_naive", "route_from_logits"]
