"""Token-sparse attention: draft queries read only selected prefix slots plus the recent slots."""

from .naive import token_sparse_attention_naive, token_sparse_mask
from .op import token_sparse_attention

__all__ = ["token_sparse_attention", "token_sparse_attention_naive", "token_sparse_mask"]
