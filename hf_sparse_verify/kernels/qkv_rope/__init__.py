"""The attention input of Llama-family layers for the few rows of decode and verify steps: the q/k/v projections in
one launch (`qkv_proj`) and the per-head RMSNorm + rotary embedding of queries and keys in another (`rope_qk`),
where transformers runs three GEMMs, their split-K reductions and a dozen elementwise kernels
and the output projection in a third (`row_linear`) (used by `hf_sparse_verify.integrations.qkv_attention.FusedQKVAttention`)."""

from .naive import qkv_proj_naive, rope_qk_naive
from .op import MAX_ROWS, qkv_proj, rope_qk, rope_qk_cache, row_linear

__all__ = [
    "MAX_ROWS",
    "qkv_proj",
    "qkv_proj_naive",
    "rope_qk",
    "rope_qk_cache",
    "rope_qk_naive",
    "row_linear",
]
