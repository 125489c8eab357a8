"""Reference sparse FFN (the sparse-verification paper §3.4) in plain PyTorch, float64-capable: the definitions the Triton kernels of
this folder are tested against.

A gated MLP computes ``y = down(silu(gate(x)) * up(x))``. Sparse verification keeps, per batch row, the channels
``i`` whose gate activation ``|silu(gate(x))_i|`` reaches ``tau`` for at least one of the row's ``q`` verify
tokens; the other channels are skipped in ``up`` and ``down`` for every token of the row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_act_naive(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w_gate.T) * (x @ w_up.T)`` with transformers' rounding (each matmul and the product in
    ``x.dtype``); ``x`` ``[..., H]``, ``w_gate`` / ``w_up`` ``[I, H]`` -> ``[..., I]``."""
    return F.silu(x @ w_gate.T) * (x @ w_up.T)


def channel_mask_naive(act: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """``[B, I]`` bool: channel ``i`` of row ``b`` is kept when ``max_t |act[b, t, i]| >= tau`` (compared in float32
    or wider, so ``tau`` is never rounded to a 16-bit dtype); ``act`` ``[B, q, I]``."""
    return act.abs().amax(dim=1).to(torch.promote_types(act.dtype, torch.float32)) >= tau


def sparse_gate_up_naive(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, tau: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, keep)``: ``keep`` ``[B, I]`` = `channel_mask_naive` of ``act = silu(x @ w_gate.T)``, ``h`` ``[B, q, I]``
    = ``act * (x @ w_up.T)`` zeroed where the row skips the channel. Gate, ``act``, up and the product are rounded
    to ``x.dtype`` as eager rounds them; matmuls in float32 or wider. Computed densely (no host sync, so it is also
    the CPU path)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    gate = (x.to(acc) @ w_gate.to(acc).T).to(x.dtype)
    act = F.silu(gate.to(acc)).to(x.dtype)  # [B, q, I]
    keep = channel_mask_naive(act, tau)  # [B, I]
    up = (x.to(acc) @ w_up.to(acc).T).to(x.dtype)
    h = (act.to(acc) * up.to(acc)).to(x.dtype)
    return torch.where(keep[:, None, :], h, torch.zeros((), dtype=x.dtype, device=x.device)), keep


def masked_down_naive(h: torch.Tensor, w_down_t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``h @ w_down_t`` with the channels no row keeps left out (``keep`` ``[B, I]``; ``h`` ``[B, q, I]`` is zero
    where its row skips a channel), accumulated in float32 or wider, rounded to ``h.dtype``."""
    acc = torch.promote_types(h.dtype, torch.float32)
    used = keep.any(0)[:, None]  # [I, 1]: rows of w_down_t some row reads
    w = torch.where(used, w_down_t.to(acc), torch.zeros((), dtype=acc, device=h.device))
    return (h.to(acc) @ w).to(h.dtype)


def sparse_mlp_naive(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, tau: torch.Tensor | float
) -> torch.Tensor:
    """The whole sparse MLP as a dense computation with the skipped channels zeroed: ``x`` ``[B, q, H]``,
    ``w_gate`` / ``w_up`` ``[I, H]``, ``w_down`` ``[H, I]`` -> ``[B, q, H]``. ``tau = 0`` is the dense MLP."""
    act = F.silu(x @ w_gate.T)  # [B, q, I]
    keep = channel_mask_naive(act, tau)  # [B, I]
    h = act * (x @ w_up.T) * keep[:, None, :].to(x.dtype)
    return h @ w_down.T
