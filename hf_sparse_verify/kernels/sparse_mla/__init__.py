"""Sparse MLA attention: DSA's per-query top-k over multi-head latent attention caches, absorbed (every head reads
the shared latent rows), with a verify step's selections merged so each selected row is read once."""

from .naive import (
    MAX_MERGED_QUERIES,
    merged_selection,
    selected_attention_expanded,
    selection_mask,
    single_selection,
    sparse_mla_naive,
)
from .op import sparse_mla

__all__ = [
    "MAX_MERGED_QUERIES",
    "merged_selection",
    "selected_attention_expanded",
    "selection_mask",
    "single_selection",
    "sparse_mla",
    "sparse_mla_naive",
]
