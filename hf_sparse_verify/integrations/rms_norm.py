"""`TritonRMSNorm`: the Llama-family RMSNorm on the fused kernel of `hf_sparse_verify.kernels.rms_norm`."""

from __future__ import annotations

import torch

from ..kernels.rms_norm import rms_norm

#: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` with float32 statistics
#: (checked against transformers' source, 5.17.0 and 5.24.0; tests compare each with its replacement)
REPLACEABLE = frozenset(
    {
        "LlamaRMSNorm",
        "MistralRMSNorm",
        "MixtralRMSNorm",
        "OlmoeRMSNorm",
        "Qwen2RMSNorm",
        "Qwen2MoeRMSNorm",
        "Qwen3RMSNorm",
        "Qwen3MoeRMSNorm",
    }
)


class TritonRMSNorm(torch.nn.Module):
    """Stateless stand-in for a Llama-family RMSNorm; reads ``weight`` and ``variance_epsilon`` of the original."""

    reads = ("weight", "variance_epsilon")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
