"""Sparse MLA attention: DSA's per-query top-k over multi-head latent attention caches, absorbed (every head reads
the shared latent rows), with a verify step's selections merged so each selected row is read once."""

from .naive import (
    MAX_MERGED_QUERIES,
    merged_selection,
    per_query_selection,
    selected_attention_expanded,
    selection_mask,
    sparse_mla_naive,
)
from .op import SCHEDULES, sparse_mla

__all__ = [
    "SCHEDULES",
    "MAX_MERGED_QUERIES",
    "merged_selection",
    "selected_attention_expanded",
    "selection_mask",
    "per_query_selection",
    "sparse_mla",
    "sparse_mla_naive",
]
