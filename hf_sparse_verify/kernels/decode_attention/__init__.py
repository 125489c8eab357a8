"""Multi-query decode attention over a preallocated cache (decode and verify steps), with optional Vegas score
collection."""

from .naive import attention_mask, decode_attention_naive
from .op import decode_attention

__all__ = ["attention_mask", "decode_attention", "decode_attention_naive"]
