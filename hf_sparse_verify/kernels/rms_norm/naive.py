"""Reference RMSNorm: exactly the arithmetic of transformers' Llama-family ``*RMSNorm.forward`` (float32
statistics, the normalized value rounded to the input dtype, then multiplied by the weight)."""

from __future__ import annotations

import torch


def rms_norm_naive(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x**2, -1) + eps)).to(x.dtype)`` with float32 statistics; ``x`` ``[..., N]``."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + eps)).to(x.dtype)


def rms_norm_float32_naive(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """The RMSNorm of Gemma 3n and Gemma 4 (``offset`` 0) and the zero-centered one of Gemma, Qwen3-Next and Qwen3.5
    (``offset`` 1): ``(x * rsqrt(mean(x**2, -1) + eps)) * (offset + weight)`` in float32, rounded to ``x``'s dtype
    at the end; ``x`` ``[..., N]``."""
    hidden = x.to(torch.float32)
    output = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return (output * (offset + weight.float())).type_as(x)


def rms_norm_gated_naive(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The gated RMSNorm after a Gated DeltaNet recurrence (Qwen3-Next, Qwen3.5, OLMo-Hybrid): the Llama form
    (`rms_norm_naive`: ``weight * normalized.to(x.dtype)``) times ``silu(gate)`` in float32, rounded to ``x``'s
    dtype; ``x`` and ``gate`` ``[..., N]``."""
    gated = rms_norm_naive(x, weight, eps) * torch.nn.functional.silu(gate.to(torch.float32))
    return gated.to(x.dtype)


def add_rms_norm_naive(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decoder layer's ``total = residual + x`` followed by its RMSNorm: returns ``(rms_norm(total), total)``."""
    total = residual + x
    return rms_norm_naive(total, weight, eps), total
