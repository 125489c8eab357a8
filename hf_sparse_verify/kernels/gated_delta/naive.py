"""Reference: the gated delta rule over a verify window, token by token, keeping the state after every token.

The arithmetic of transformers' ``torch_recurrent_gated_delta_rule`` (Qwen3-Next, Qwen3.5) with
``use_qk_l2norm_in_kernel=True``: queries and keys l2-normalised in float32 (eps 1e-6), queries scaled by
``1 / sqrt(D_k)``, each key head serving ``H_v / H_k`` consecutive value heads; per token ``S <- S * exp(g)``,
``S <- S + k (beta (v - S^T k))^T``, ``o = S^T q``.
"""

from __future__ import annotations

import torch


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_window_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, states)``: ``out`` ``[B, W, H_v, D_v]`` in ``value``'s dtype and ``states`` ``[B, W, H_v, D_k, D_v]``
    float32, the state after each token of the window. Inputs: ``query`` and ``key`` ``[B, W, H_k, D_k]``, ``value``
    ``[B, W, H_v, D_v]``, ``g`` (log decay) and ``beta`` ``[B, W, H_v]``, ``state`` ``[B, H_v, D_k, D_v]`` (the
    state before the window)."""
    heads_v, heads_k = value.shape[2], key.shape[2]
    q = _l2norm(query.float().repeat_interleave(heads_v // heads_k, dim=2))
    k = _l2norm(key.float().repeat_interleave(heads_v // heads_k, dim=2))
    q = q / (q.shape[-1] ** 0.5)
    v, g, beta = value.float(), g.float(), beta.float()
    s = state.float()
    outs, states = [], []
    for t in range(value.shape[1]):
        s = s * g[:, t].exp()[..., None, None]
        memory = (s * k[:, t, :, :, None]).sum(dim=-2)  # [B, H_v, D_v]
        delta = (v[:, t] - memory) * beta[:, t, :, None]
        s = s + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((s * q[:, t, :, :, None]).sum(dim=-2))
        states.append(s)
    return torch.stack(outs, dim=1).to(value.dtype), torch.stack(states, dim=1)


def gated_delta_ring_naive(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ring: torch.Tensor,
    start: torch.Tensor,
    every_state: bool = True,
) -> torch.Tensor:
    """`gated_delta_window_naive` with the states in a ring ``[B, R, H_v, D_k, D_v]`` (any float dtype): row ``b``
    starts from the state at slot ``(start[b] - 1) mod R`` and leaves the state after token ``t`` at slot
    ``(start[b] + t) mod R`` (only the last token's with ``every_state=False``). Returns ``out``; ``ring`` is
    updated in place."""
    rows = torch.arange(ring.shape[0], device=ring.device)
    slots = ring.shape[1]
    state = ring[rows, (start - 1).remainder(slots)]
    out, states = gated_delta_window_naive(query, key, value, g, beta, state)
    width = value.shape[1]
    if every_state:
        written = (start[:, None] + torch.arange(width, device=ring.device)).remainder(slots)
        ring[rows[:, None], written] = states.to(ring.dtype)
    else:
        ring[rows, (start + width - 1).remainder(slots)] = states[:, -1].to(ring.dtype)
    return out
