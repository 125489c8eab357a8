"""``hsv::rms_norm``: validation, registration with ``torch.library``, Triton where it runs, reference elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import add_rms_norm_naive, rms_norm_float32_naive, rms_norm_gated_naive, rms_norm_naive

#: the arithmetic forms `rms_norm` computes
FORMS = ("llama", "zero_centered", "float32")

MAX_COLS = 65536


def _check_rows(name: str, x: torch.Tensor, weight: torch.Tensor, same_dtype: bool = False) -> None:
    """``x`` ``[..., N]`` with ``N <= MAX_COLS`` and a weight ``[N]`` (of ``x``'s dtype with ``same_dtype``)."""
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1] or (same_dtype and weight.dtype != x.dtype):
        wanted = "a weight [N] of x's dtype" if same_dtype else "weight [N]"
        raise ValueError(
            f"{name} needs x [..., N] and {wanted}; got {tuple(x.shape)} {x.dtype} and {tuple(weight.shape)} "
            f"{weight.dtype}"
        )
    if x.shape[-1] > MAX_COLS:
        raise ValueError(f"{name} handles rows of at most {MAX_COLS} elements, got {x.shape[-1]}")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit last stride, as the kernels read rows."""
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("hsv::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float, form: str) -> torch.Tensor:
    if triton_runs_on(x.device) and x.dtype != torch.float64:
        from .kernel import launch

        return launch(x, weight, eps, form)
    if form == "llama":
        return rms_norm_naive(x, weight, eps)
    return rms_norm_float32_naive(x, weight, eps, 1.0 if form == "zero_centered" else 0.0)


@_rms_norm_op.register_fake
def _(x, weight, eps, form):
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype) if form == "llama" else x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, form: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dimension in one of transformers' arithmetic forms.

    Args:
        x: ``[..., N]``, contiguous in the last dimension.
        weight: ``[N]``.
        eps: variance epsilon.
        form: ``"llama"`` (the Llama family: the normalized value rounded to ``x``'s dtype, then times the weight;
            `rms_norm_naive`), ``"zero_centered"`` (Gemma, Qwen3-Next, Qwen3.5: times ``1 + weight`` in float32,
            one rounding) or ``"float32"`` (Gemma 3n, Gemma 4: times the weight in float32, one rounding); see
            `rms_norm_float32_naive`.

    Example:
        >>> x, w = torch.randn(2, 3, 8), torch.rand(8)
        >>> torch.allclose(rms_norm(x, w, 1e-6), rms_norm_naive(x, w, 1e-6), atol=1e-6)
        True
    """
    _check_rows("rms_norm", x, weight)
    if form not in FORMS:
        raise ValueError(f"rms_norm form must be one of {FORMS}, got {form!r}")
    return torch.ops.hsv.rms_norm(_rows(x), weight, float(eps), form)


@torch.library.custom_op("hsv::rms_norm_gated", mutates_args=())
def _rms_norm_gated_op(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if triton_runs_on(x.device) and x.dtype != torch.float64:
        from .kernel import launch_gated

        return launch_gated(x, gate, weight, eps)
    return rms_norm_gated_naive(x, gate, weight, eps)


@_rms_norm_gated_op.register_fake
def _(x, gate, weight, eps):
    return x.new_empty(x.shape)


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The gated RMSNorm of Gated DeltaNet layers in one launch (see `rms_norm_gated_naive` for the arithmetic).

    Args:
        x, gate: ``[..., N]``, one shape.
        weight: ``[N]``, of ``x``'s dtype.
        eps: variance epsilon.

    Example:
        >>> x, z, w = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.rand(8)
        >>> torch.allclose(rms_norm_gated(x, z, w, 1e-6), rms_norm_gated_naive(x, z, w, 1e-6), atol=1e-6)
        True
    """
    if x.shape != gate.shape or x.device != gate.device:
        raise ValueError(
            f"rms_norm_gated needs x and gate of one shape and device; got {tuple(x.shape)} on {x.device} and "
            f"{tuple(gate.shape)} on {gate.device}"
        )
    _check_rows("rms_norm_gated", x, weight, same_dtype=True)
    return torch.ops.hsv.rms_norm_gated(_rows(x), _rows(gate), weight, float(eps))


@torch.library.custom_op("hsv::add_rms_norm", mutates_args=())
def _add_rms_norm_op(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if triton_runs_on(x.device) and x.dtype != torch.float64:
        from .kernel import launch_add

        return launch_add(x, residual, weight, eps)
    return add_rms_norm_naive(x, residual, weight, eps)


@_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype)), x.new_empty(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``total = residual + x`` (rounded to the activation dtype, as eager adds) and its RMSNorm in one launch:
    returns ``(rms_norm(total), total)``, bitwise what `add_rms_norm_naive` computes.

    Args:
        x, residual: ``[..., N]``, one shape and dtype.
        weight: ``[N]``.
        eps: variance epsilon.

    Example:
        >>> x, r, w = torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.rand(8)
        >>> normed, total = add_rms_norm(x, r, w, 1e-6)
        >>> torch.equal(total, r + x), torch.allclose(normed, rms_norm_naive(r + x, w, 1e-6))
        (True, True)
    """
    if x.shape != residual.shape or x.dtype != residual.dtype or x.device != residual.device:
        raise ValueError(
            f"add_rms_norm needs x and residual of one shape, dtype and device; got {tuple(x.shape)} "
            f"{x.dtype} {x.device} and {tuple(residual.shape)} {residual.dtype} {residual.device}"
        )
    _check_rows("add_rms_norm", x, weight)
    return torch.ops.hsv.add_rms_norm(_rows(x), _rows(residual), weight, float(eps))
