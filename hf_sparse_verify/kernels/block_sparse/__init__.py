"""Block-sparse verify attention: the cache viewed as blocks, a shared block list per (row, KV head) or an exact
merged schedule with per-query masks, forced sink and local blocks."""

from hf_sparse_verify.kernels.block_sparse.naive import (
    attended_slots,
    block_sparse_attention_naive,
    forced_block_mask,
)
from hf_sparse_verify.kernels.block_sparse.op import block_sparse_attention, merge_query_blocks

__all__ = [
    "attended_slots",
    "block_sparse_attention",
    "block_sparse_attention_naive",
    "forced_block_mask",
    "merge_query_blocks",
]
