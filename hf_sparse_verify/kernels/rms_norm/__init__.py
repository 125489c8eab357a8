"""RMSNorm with transformers' Llama-family arithmetic, or the float32 forms of Gemma, Qwen3-Next and Gemma 4, and the
gated norm of Gated DeltaNet layers, in one launch (used by `hf_sparse_verify.integrations`)."""

from .naive import add_rms_norm_naive, rms_norm_float32_naive, rms_norm_gated_naive, rms_norm_naive
from .op import add_rms_norm, rms_norm, rms_norm_gated

__all__ = [
    "add_rms_norm",
    "add_rms_norm_naive",
    "rms_norm",
    "rms_norm_float32_naive",
    "rms_norm_gated",
    "rms_norm_gated_naive",
    "rms_norm_naive",
]
