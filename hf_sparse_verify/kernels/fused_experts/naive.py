"""Reference fused experts: exactly what a routed SwiGLU experts block computes, written out per expert in plain
PyTorch (the definition the Triton kernels are tested against, and the op's fallback where Triton cannot run)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def active_pairs(top_k_index: torch.Tensor, n_experts: int, n_active: torch.Tensor | None) -> torch.Tensor:
    """``[T, k]`` bool: which (token, rank) pairs take part: expert id in ``[0, E)`` and rank ``< n_active[t]``."""
    active = (top_k_index >= 0) & (top_k_index < n_experts)
    if n_active is not None:
        rank = torch.arange(top_k_index.shape[1], device=top_k_index.device)
        active &= rank[None, :] < n_active[:, None]
    return active


def fused_experts_naive(
    hidden: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    n_active: torch.Tensor | None = None,
    transposed: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[t] = sum_r w[t, r] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t]))`` over the active pairs
    ``(t, r)`` with ``e = top_k_index[t, r]`` (see `active_pairs`).

    Matmuls run in the input dtype, the weighted sum over pairs in float32 (float64 for float64 inputs); the
    result is in ``hidden.dtype``; with ``residual`` ``[T, H]`` it is ``residual + result``, as a decoder layer adds
    it. Shapes: ``hidden [T, H]``, ``w_gate_up [E, 2I, H]`` (gate rows first) and
    ``w_down [E, H, I]``, or ``[E, H, 2I]`` / ``[E, I, H]`` when ``transposed``; ``top_k_index`` / ``top_k_weights``
    ``[T, k]``; ``n_active [T]``.
    """
    n_experts = w_gate_up.shape[0]
    gate_up = w_gate_up.transpose(1, 2) if transposed else w_gate_up  # [E, 2I, H]
    down = w_down.transpose(1, 2) if transposed else w_down  # [E, H, I]
    inter = down.shape[2]
    acc_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    out = torch.zeros(hidden.shape, dtype=acc_dtype, device=hidden.device)  # [T, H]
    active = active_pairs(top_k_index, n_experts, n_active)
    for e in range(n_experts):
        token, rank = torch.nonzero((top_k_index == e) & active, as_tuple=True)
        projected = hidden[token] @ gate_up[e].T  # [n, 2I]
        h = F.silu(projected[:, :inter]) * projected[:, inter:]  # [n, I]
        y = (h @ down[e].T).to(acc_dtype)  # [n, H]
        out.index_add_(0, token, y * top_k_weights[token, rank, None].to(acc_dtype))
    out = out.to(hidden.dtype)
    return out if residual is None else residual + out
