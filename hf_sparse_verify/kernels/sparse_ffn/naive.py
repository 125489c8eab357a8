"""Reference sparse FFN (papers/000 §3.4) in plain PyTorch, float64-capable: the definitions the Triton kernels of
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


def compact_naive(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept channel ids of each row in increasing order: ``index [B, I]`` int32 (entries past ``count[b]`` are 0)
    and ``count [B]`` int32; ``keep`` ``[B, I]`` bool."""
    index = torch.zeros(keep.shape, dtype=torch.int32, device=keep.device)
    count = torch.zeros(keep.shape[0], dtype=torch.int32, device=keep.device)
    for b in range(keep.shape[0]):
        ids = torch.nonzero(keep[b]).flatten()
        index[b, : ids.numel()] = ids.to(torch.int32)
        count[b] = ids.numel()
    return index, count


def kept_mask_naive(index: torch.Tensor, count: torch.Tensor, inter: int) -> torch.Tensor:
    """``[B, I]`` bool from the compacted form: True at ``index[b, s]`` for ``s < count[b]`` (no host sync)."""
    slots = torch.arange(index.shape[1], device=index.device)
    target = torch.where(slots[None, :] < count[:, None], index.long(), inter)  # unused slots -> spare column
    keep = torch.zeros(index.shape[0], inter + 1, dtype=torch.bool, device=index.device)
    return keep.scatter_(1, target, True)[:, :inter]


def sparse_up_down_naive(
    x: torch.Tensor,
    act: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    index: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """``y[b, t] = sum_{c kept} act[b, t, c] * (x[b, t] . w_up[c]) * w_down_t[c]`` over the first ``count[b]``
    channels of ``index[b]``; ``x`` ``[B, q, H]``, ``act`` ``[B, q, I]``, ``w_up`` / ``w_down_t`` ``[I, H]`` (any
    strides) -> ``[B, q, H]`` in ``x.dtype``. ``up`` and the product ``act * up`` are rounded to ``x.dtype`` as
    eager rounds them; matmuls in float32 or wider. Computed densely with the skipped channels zeroed (no host
    sync, so it also serves as the CPU path)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    keep = kept_mask_naive(index, count, w_up.shape[0])  # [B, I]
    up = (x.to(acc) @ w_up.to(acc).T).to(x.dtype)  # [B, q, I]
    h = (act.to(acc) * up.to(acc)).to(x.dtype) * keep[:, None, :]
    return (h.to(acc) @ w_down_t.to(acc)).to(x.dtype)


def sparse_mlp_naive(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, tau: torch.Tensor | float
) -> torch.Tensor:
    """The whole sparse MLP as a dense computation with the skipped channels zeroed: ``x`` ``[B, q, H]``,
    ``w_gate`` / ``w_up`` ``[I, H]``, ``w_down`` ``[H, I]`` -> ``[B, q, H]``. ``tau = 0`` is the dense MLP."""
    act = F.silu(x @ w_gate.T)  # [B, q, I]
    keep = channel_mask_naive(act, tau)  # [B, I]
    h = act * (x @ w_up.T) * keep[:, None, :].to(x.dtype)
    return h @ w_down.T
