"""LOSSY sparse verification (opt-in through `SpeculationConfig.lossy_sparse_verify`): block-sparse verify attention
with inter-layer reuse (`attention`), sparse FFN channels (`hf_sparse_verify.integrations.mlp`), expert skipping
(`moe`), their calibration (`calibration`) and the step slot that carries them (`state`)."""

from .config import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE

__all__ = ["LossySparseVerify", "SparseAttention", "SparseFFN", "SparseMoE"]
