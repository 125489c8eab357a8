"""Per-row top-k slot selection for Vegas' draft KV: pooled scores, a kept recent window, ascending slots."""

from .naive import pool_scores, prefix_valid, topk_slots_naive
from .op import topk_slots

__all__ = ["pool_scores", "prefix_valid", "topk_slots", "topk_slots_naive"]
