"""`TritonRMSNorm`: the Llama-family RMSNorm, and the zero-centered one of Gemma, Qwen3-Next and Qwen3.5, on the
fused kernel of `hf_sparse_verify.kernels.rms_norm`."""

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


#: RMSNorm classes whose forward is ``((x * rsqrt(mean(x^2) + eps)) * (1 + weight.float())).type_as(x)`` on
#: ``x.float()``, the weight stored zero-centered (their ``forward`` and ``_norm`` checked equal to Qwen3-Next's, up to
#: comments, in transformers 5.24.0's source; tests compare each with its replacement)
ZERO_CENTERED = frozenset(
    {
        "GemmaRMSNorm",
        "Gemma2RMSNorm",
        "Gemma3RMSNorm",
        "Qwen3NextRMSNorm",
        "Qwen3_5RMSNorm",
        "Qwen3_5MoeRMSNorm",
    }
)


def replaceable_norm(module: torch.nn.Module) -> bool:
    """Whether `TritonRMSNorm` computes what ``module`` computes: a class of `REPLACEABLE` or `ZERO_CENTERED` with a
    one-dimensional weight and an epsilon."""
    name = type(module).__name__
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    return (
        (name in REPLACEABLE or name in ZERO_CENTERED)
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and isinstance(eps, float)
    )


class TritonRMSNorm(torch.nn.Module):
    """Stateless stand-in for a Llama-family or zero-centered RMSNorm (`replaceable_norm`); reads ``weight`` and
    the epsilon (``variance_epsilon``, or ``eps``) of the original."""

    reads = ("weight", "variance_epsilon", "eps")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_norm(original):
            raise ValueError(f"{type(original).__name__} is not an RMSNorm of {sorted(REPLACEABLE | ZERO_CENTERED)}")
        self.weight = original.weight
        self.variance_epsilon = getattr(original, "variance_epsilon", getattr(original, "eps", None))
        self.zero_centered = type(original).__name__ in ZERO_CENTERED

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, self.zero_centered)
