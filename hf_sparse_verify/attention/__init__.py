"""Attention for speculative decoding: the preallocated cache, the ``"sparse_verify"`` attention registered with
transformers, and its backends (plain-PyTorch reference, gather-based token-sparse, Triton kernels). The step each
forward runs is described by `hf_sparse_verify.step.StepContext`."""

from .cache import SpecCache
from .dispatch import BACKENDS, register_backend
from .interface import NAME, register

__all__ = ["BACKENDS", "NAME", "SpecCache", "register", "register_backend"]
