"""``hsv::gated_delta_window``: validation, registration with ``torch.library``, Triton where it runs, reference
elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import gated_delta_window_naive


@torch.library.custom_op("hsv::gated_delta_window", mutates_args=())
def _gated_delta_window_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if triton_runs_on(value.device) and value.dtype != torch.float64:
        from .kernel import launch

        return launch(query, key, value, g, beta, state)
    return gated_delta_window_naive(query, key, value, g, beta, state)


@_gated_delta_window_op.register_fake
def _(query, key, value, g, beta, state):
    batch, width, heads_v, d_v = value.shape
    return value.new_empty(value.shape), value.new_empty(
        batch, width, heads_v, key.shape[3], d_v, dtype=torch.float32
    )


def gated_delta_window(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The gated delta rule over a window of tokens from ``state``, with the state after every token (see
    `gated_delta_window_naive` for the arithmetic).

    Args:
        query, key: ``[B, W, H_k, D_k]``.
        value: ``[B, W, H_v, D_v]``, ``H_v`` a multiple of ``H_k``.
        g, beta: ``[B, W, H_v]`` (log decay, update strength).
        state: ``[B, H_v, D_k, D_v]``, the state before the window (float32 kept as is; others cast).

    Returns:
        ``(out [B, W, H_v, D_v]`` in ``value``'s dtype, ``states [B, W, H_v, D_k, D_v]`` float32``)``.

    Example:
        >>> q, k = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
        >>> v, g, beta = torch.randn(1, 3, 2, 4), -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
        >>> out, states = gated_delta_window(q, k, v, g, beta, torch.zeros(1, 2, 4, 4))
        >>> out.shape, states.shape
        (torch.Size([1, 3, 2, 4]), torch.Size([1, 3, 2, 4, 4]))
    """
    if query.dim() != 4 or key.shape != query.shape or value.dim() != 4 or value.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"gated_delta_window needs query and key [B, W, H_k, D_k] and value [B, W, H_v, D_v]; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    batch, width, heads_v, d_v = value.shape
    if heads_v % key.shape[2]:
        raise ValueError(f"value heads ({heads_v}) must be a multiple of key heads ({key.shape[2]})")
    if g.shape != (batch, width, heads_v) or beta.shape != g.shape:
        raise ValueError(f"g and beta must be [B, W, H_v] = {(batch, width, heads_v)}, got {tuple(g.shape)}, "
                         f"{tuple(beta.shape)}")  # fmt: skip
    if state.shape != (batch, heads_v, key.shape[3], d_v):
        raise ValueError(
            f"state must be [B, H_v, D_k, D_v] = {(batch, heads_v, key.shape[3], d_v)}, got {tuple(state.shape)}"
        )
    query, key, value, g, beta = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value, g, beta))
    return torch.ops.hsv.gated_delta_window(query, key, value, g, beta, state.float().contiguous())
