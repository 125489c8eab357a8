"""DSA index scores: the per-token scores a DeepSeek-V3.2 / GLM-MoE-DSA indexer takes its top-k over, computed
without the float32 key copy and the per-head score tensor transformers makes."""

from .naive import index_scores_naive
from .op import index_scores

__all__ = ["index_scores", "index_scores_naive"]
