"""``hsv::rms_norm``: validation, registration with ``torch.library``, Triton where it runs, reference elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import rms_norm_naive

MAX_COLS = 65536


@torch.library.custom_op("hsv::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if triton_runs_on(x.device) and x.dtype != torch.float64:
        from .kernel import launch

        return launch(x, weight, eps)
    return rms_norm_naive(x, weight, eps)


@_rms_norm_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension with transformers' Llama-family arithmetic (see `rms_norm_naive`).

    Args:
        x: ``[..., N]``, contiguous in the last dimension.
        weight: ``[N]``.
        eps: variance epsilon.

    Example:
        >>> x, w = torch.randn(2, 3, 8), torch.rand(8)
        >>> torch.allclose(rms_norm(x, w, 1e-6), rms_norm_naive(x, w, 1e-6), atol=1e-6)
        True
    """
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"rms_norm needs x [..., N] and weight [N]; got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"rms_norm handles rows of at most {MAX_COLS} elements, got {x.shape[-1]}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    return torch.ops.hsv.rms_norm(x, weight, float(eps))
