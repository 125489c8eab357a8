"""``hsv::fused_experts``: validation, registration with ``torch.library``, Triton where it runs, the reference
elsewhere (CPU without ``TRITON_INTERPRET=1``, float64)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import fused_experts_naive

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_DTYPES = (torch.int32, torch.int64)


@torch.library.custom_op("hsv::fused_experts", mutates_args=())
def _fused_experts_op(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    n_active: torch.Tensor | None,
    transposed: bool,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    if triton_runs_on(hidden.device) and hidden.dtype != torch.float64:
        from .kernel import launch

        return launch(
            hidden, w_gate_up, w_down, top_k_index, top_k_weights, n_active, transposed, residual=residual
        )
    return fused_experts_naive(
        hidden, w_gate_up, w_down, top_k_index, top_k_weights, n_active, transposed, residual=residual
    )


@_fused_experts_op.register_fake
def _(hidden, w_gate_up, w_down, top_k_index, top_k_weights, n_active, transposed, residual):
    return hidden.new_empty(hidden.shape)


def _check(
    hidden, w_gate_up, w_down, top_k_index, top_k_weights, n_active, transposed, residual=None
) -> None:
    if hidden.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(
            "fused_experts needs hidden [T, H], w_gate_up [E, 2I, H] and w_down [E, H, I] (or [E, H, 2I] and "
            f"[E, I, H] with transposed=True); got {tuple(hidden.shape)}, {tuple(w_gate_up.shape)}, "
            f"{tuple(w_down.shape)}"
        )
    tokens, dim = hidden.shape
    experts = w_gate_up.shape[0]
    gate_up = (experts, w_gate_up.shape[2], w_gate_up.shape[1]) if transposed else tuple(w_gate_up.shape)
    down = (experts, w_down.shape[2], w_down.shape[1]) if transposed else tuple(w_down.shape)
    inter = down[2]
    if gate_up != (experts, 2 * inter, dim) or down != (experts, dim, inter):
        raise ValueError(
            f"expert weights do not match hidden size {dim}: as [E, 2I, H] / [E, H, I] they are {gate_up} and "
            f"{down} (transposed={transposed})"
        )
    if top_k_index.dim() != 2 or top_k_index.shape[0] != tokens or top_k_index.dtype not in _INT_DTYPES:
        raise ValueError(
            f"top_k_index must be [T, k] = [{tokens}, k] int32/int64; got {tuple(top_k_index.shape)} "
            f"{top_k_index.dtype}"
        )
    if top_k_weights.shape != top_k_index.shape or not top_k_weights.is_floating_point():
        raise ValueError(
            f"top_k_weights must be a float tensor shaped like top_k_index {tuple(top_k_index.shape)}; got "
            f"{tuple(top_k_weights.shape)} {top_k_weights.dtype}"
        )
    if n_active is not None and (n_active.shape != (tokens,) or n_active.dtype not in _INT_DTYPES):
        raise ValueError(
            f"n_active must be [T] = [{tokens}] int32/int64; got {tuple(n_active.shape)} {n_active.dtype}"
        )
    if hidden.dtype not in _FLOAT_DTYPES or w_gate_up.dtype != hidden.dtype or w_down.dtype != hidden.dtype:
        raise ValueError(
            "hidden and the expert weights must share one float dtype; got "
            f"{hidden.dtype}, {w_gate_up.dtype}, {w_down.dtype}"
        )
    if residual is not None and (residual.shape != hidden.shape or residual.dtype != hidden.dtype):
        raise ValueError(
            f"residual must match hidden {tuple(hidden.shape)} {hidden.dtype}; got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    tensors = (hidden, w_gate_up, w_down, top_k_index, top_k_weights) + tuple(
        t for t in (n_active, residual) if t is not None
    )
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")


def fused_experts(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    n_active: torch.Tensor | None = None,
    *,
    transposed: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed SwiGLU experts in one op: ``out[t] = sum_r w[t, r] * down[e] @ (silu(gate[e] @ x[t]) * up[e] @ x[t])``
    over the active pairs of token ``t`` (``e = top_k_index[t, r]``), reading each selected expert's weights once
    per block of its pairs; no host sync, grids from shapes only, deterministic.

    Args:
        hidden: ``[T, H]``.
        w_gate_up: ``[E, 2I, H]``, gate rows ``[0, I)`` then up rows (transformers' concatenated layout), or
            ``[E, H, 2I]`` when ``transposed``.
        w_down: ``[E, H, I]``, or ``[E, I, H]`` when ``transposed``; same dtype as ``hidden``.
        top_k_index: ``[T, k]`` int expert ids (k = 1..8 typical); ids outside ``[0, E)`` are skipped.
        top_k_weights: ``[T, k]`` routing weights (any float dtype; applied in float32).
        n_active: ``[T]`` int, experts kept per token: ranks ``r >= n_active[t]`` are dropped (``top_k_index``
            from ``torch.topk`` is sorted by weight, so the lowest-weight experts go first). Default: all ``k``.
            The remaining weights are not renormalized.
        transposed: weights stored ``[E, K, N]`` (transformers' ``is_transposed`` experts).
        residual: ``[T, H]`` in ``hidden.dtype``, added to the result in the same launch (bitwise the decoder
            layer's ``residual + experts(x)``; `hf_sparse_verify.integrations.FusedDecoderLayer` passes it).

    Returns:
        ``[T, H]`` in ``hidden.dtype``; matmuls accumulate in float32, the intermediate is rounded to the
        activation dtype, the sum over pairs is in float32 in a fixed order.

    Example:
        >>> x = torch.randn(3, 32); wgu = torch.randn(4, 48, 32); wd = torch.randn(4, 32, 24)
        >>> idx = torch.tensor([[0, 2], [1, 0], [3, 2]]); w = torch.rand(3, 2)
        >>> fused_experts(x, wgu, wd, idx, w).shape
        torch.Size([3, 32])
    """
    _check(hidden, w_gate_up, w_down, top_k_index, top_k_weights, n_active, transposed, residual)
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    return torch.ops.hsv.fused_experts(
        hidden,
        w_gate_up,
        w_down,
        top_k_index.contiguous(),
        top_k_weights.contiguous(),
        n_active.contiguous() if n_active is not None else None,
        transposed,
        residual,
    )
