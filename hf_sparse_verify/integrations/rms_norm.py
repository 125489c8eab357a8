"""`TritonRMSNorm`: the Llama-family RMSNorm, the zero-centered one of Gemma, Qwen3-Next and Qwen3.5, and the float32
one of Gemma 3n and Gemma 4, on the fused kernel of `hf_sparse_verify.kernels.rms_norm`."""

from __future__ import annotations

import torch

from ..kernels.rms_norm import rms_norm, rms_norm_gated, rms_norm_gated_naive

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


#: RMSNorm classes whose forward is ``(x * (mean(x^2) + eps) ** -0.5 * weight.float()).type_as(x)`` on ``x.float()``,
#: the weight left out where ``with_scale`` is False (``forward``, ``_norm`` and ``__init__`` checked equal to Gemma 4's,
#: up to comments, in transformers 5.24.0's source; tests compare each with its replacement). transformers takes the
#: power ``-0.5`` where the kernel takes a reciprocal square root: equal up to float32 rounding.
FLOAT32_SCALED = frozenset({"Gemma3nRMSNorm", "Gemma4RMSNorm", "Gemma4UnifiedRMSNorm"})


def _form(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    if name in REPLACEABLE:
        return "llama"
    if name in ZERO_CENTERED:
        return "zero_centered"
    if name in FLOAT32_SCALED:
        return "float32"
    return None


def replaceable_norm(module: torch.nn.Module) -> bool:
    """Whether `TritonRMSNorm` computes what ``module`` computes: a class of `REPLACEABLE`, `ZERO_CENTERED` or
    `FLOAT32_SCALED` with a one-dimensional weight (or, in the last, none: ``with_scale=False``) and an epsilon."""
    form = _form(module)
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    unscaled = form == "float32" and getattr(module, "with_scale", True) is False and weight is None
    return (
        form is not None
        and (unscaled or (isinstance(weight, torch.Tensor) and weight.dim() == 1))
        and isinstance(eps, float)
    )


class TritonRMSNorm(torch.nn.Module):
    """Stateless stand-in for an RMSNorm `replaceable_norm` accepts; reads ``weight`` (a Gemma 4 norm without scale:
    none, replaced by ones) and the epsilon (``variance_epsilon``, or ``eps``) of the original."""

    reads = ("weight", "variance_epsilon", "eps", "with_scale")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_norm(original):
            raise ValueError(
                f"{type(original).__name__} is not an RMSNorm of "
                f"{sorted(REPLACEABLE | ZERO_CENTERED | FLOAT32_SCALED)}"
            )
        self.form = _form(original)
        self.variance_epsilon = getattr(original, "variance_epsilon", getattr(original, "eps", None))
        self.weight = getattr(original, "weight", None)
        self.unit: torch.Tensor | None = None  # ones for a norm without scale, made on first use per width

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if weight is None:
            width = hidden_states.shape[-1]
            if self.unit is None or self.unit.shape[0] != width or self.unit.device != hidden_states.device:
                self.unit = torch.ones(width, dtype=torch.float32, device=hidden_states.device)
            weight = self.unit
        return rms_norm(hidden_states, weight, self.variance_epsilon, self.form)


#: gated RMSNorm classes of Gated DeltaNet layers whose forward is ``(weight * rms_norm(x).to(x.dtype)) *
#: silu(gate.float())`` rounded to ``x``'s dtype (``forward`` and ``__init__`` checked equal to Qwen3-Next's, up to
#: comments, in transformers 5.24.0's source; tests compare each with its replacement)
GATED = frozenset(
    {"Qwen3NextRMSNormGated", "Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated", "OlmoHybridRMSNormGated"}
)


def replaceable_gated_norm(module: torch.nn.Module) -> bool:
    """Whether `TritonRMSNormGated` computes what ``module`` computes: a class of `GATED` with a one-dimensional
    weight, a float epsilon and the SiLU gate."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ in GATED
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float)
        and getattr(module, "activation", None) == "silu"
    )


class TritonRMSNormGated(torch.nn.Module):
    """Stateless stand-in for a Gated DeltaNet layer's gated RMSNorm (`GATED`): ``forward(x, gate)`` in one launch;
    reads ``weight`` and ``variance_epsilon`` of the original. A weight of another dtype than the activations takes
    the reference arithmetic (transformers' promotion), not the kernel."""

    reads = ("weight", "variance_epsilon", "activation")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_gated_norm(original):
            raise ValueError(f"{type(original).__name__} is not a gated RMSNorm of {sorted(GATED)}")
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype != hidden_states.dtype:
            return rms_norm_gated_naive(hidden_states, gate, self.weight, self.variance_epsilon)
        return rms_norm_gated(hidden_states, gate, self.weight, self.variance_epsilon)
