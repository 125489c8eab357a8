"""RMSNorm with transformers' Llama-family arithmetic, or the zero-centered form of Gemma and Qwen3-Next, in one
launch (used by `hf_sparse_verify.integrations`)."""

from .naive import add_rms_norm_naive, rms_norm_naive, rms_norm_zero_centered_naive
from .op import add_rms_norm, rms_norm

__all__ = ["add_rms_norm", "add_rms_norm_naive", "rms_norm", "rms_norm_naive", "rms_norm_zero_centered_naive"]
