"""RMSNorm with transformers' Llama-family arithmetic in one launch (used by `hf_sparse_verify.modules`)."""

from .naive import rms_norm_naive
from .op import rms_norm

__all__ = ["rms_norm", "rms_norm_naive"]
