"""Attention for speculative decoding: the preallocated cache, the per-step info, the ``"sparse_verify"``
attention registered with transformers, and its backends (plain-PyTorch reference now, kernels later)."""

from .cache import SpecCache
from .dispatch import BACKENDS, register_backend
from .interface import NAME, STEP_KWARG, register, use_sparse_verify_attention
from .step import StepInfo

__all__ = [
    "BACKENDS",
    "NAME",
    "STEP_KWARG",
    "SpecCache",
    "StepInfo",
    "register",
    "register_backend",
    "use_sparse_verify_attention",
]
