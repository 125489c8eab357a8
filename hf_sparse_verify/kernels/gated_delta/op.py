"""``hsv::gated_delta_ring``: validation, registration with ``torch.library``, Triton where it runs, reference
elsewhere; `gated_delta_window`, the same rule from a state given alone (a ring of its own)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import gated_delta_ring_naive


@torch.library.custom_op("hsv::gated_delta_ring", mutates_args=("ring",))
def _gated_delta_ring_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    ring: torch.Tensor, start: torch.Tensor, every_state: bool,
) -> torch.Tensor:  # fmt: skip
    if triton_runs_on(value.device) and value.dtype != torch.float64:
        from .kernel import launch

        return launch(query, key, value, g, beta, ring, start, every_state)
    return gated_delta_ring_naive(query, key, value, g, beta, ring, start, every_state)


@_gated_delta_ring_op.register_fake
def _(query, key, value, g, beta, ring, start, every_state):
    return value.new_empty(value.shape)


def _check(query, key, value, g, beta) -> None:
    if query.dim() != 4 or key.shape != query.shape or value.dim() != 4 or value.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"the gated delta rule needs query and key [B, W, H_k, D_k] and value [B, W, H_v, D_v]; got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    batch, width, heads_v, _ = value.shape
    if heads_v % key.shape[2]:
        raise ValueError(f"value heads ({heads_v}) must be a multiple of key heads ({key.shape[2]})")
    if g.shape != (batch, width, heads_v) or beta.shape != g.shape:
        raise ValueError(f"g and beta must be [B, W, H_v] = {(batch, width, heads_v)}, got {tuple(g.shape)}, "
                         f"{tuple(beta.shape)}")  # fmt: skip


def gated_delta_ring(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    ring: torch.Tensor, start: torch.Tensor, every_state: bool = True,
) -> torch.Tensor:  # fmt: skip
    """The gated delta rule over a window of tokens, its states in a ring (a cache's: `SpecConvLayer.ring`): row
    ``b`` starts from the state at slot ``(start[b] - 1) mod R`` and leaves the state after its token ``t`` at slot
    ``(start[b] + t) mod R``, so a later step that starts after any accepted token finds its state (see
    `gated_delta_window_naive` for the arithmetic). ``every_state=False`` writes only the last token's state (for
    measuring what keeping every state costs; a partially accepted window then has no state to resume from).

    Args:
        query, key: ``[B, W, H_k, D_k]``.
        value: ``[B, W, H_v, D_v]``, ``H_v`` a multiple of ``H_k``.
        g, beta: ``[B, W, H_v]`` (log decay, update strength).
        ring: ``[B, R, H_v, D_k, D_v]``, ``R >= W``, updated in place (float32 arithmetic, stored in its dtype).
        start: ``[B]`` integer, each row's ring slot of the window's first token.

    Returns:
        ``out [B, W, H_v, D_v]`` in ``value``'s dtype.

    Example:
        >>> q, k = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
        >>> v, g, beta = torch.randn(1, 3, 2, 4), -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
        >>> ring = torch.zeros(1, 8, 2, 4, 4)
        >>> gated_delta_ring(q, k, v, g, beta, ring, torch.tensor([6])).shape  # states at slots 6, 7, 0
        torch.Size([1, 3, 2, 4])
        >>> [int(ring[0, s].abs().sum() > 0) for s in range(8)]
        [1, 0, 0, 0, 0, 0, 1, 1]
    """
    _check(query, key, value, g, beta)
    batch, width, heads_v, d_v = value.shape
    if ring.dim() != 5 or ring.shape[0] != batch or ring.shape[2:] != (heads_v, key.shape[3], d_v):
        raise ValueError(
            f"ring must be [B, R, H_v, D_k, D_v] = {(batch, 'R', heads_v, key.shape[3], d_v)}, got {tuple(ring.shape)}"
        )
    if ring.shape[1] < width:
        raise ValueError(f"a ring of {ring.shape[1]} states cannot keep a window of {width} tokens: use R >= W")
    if ring.stride(-1) != 1 or not ring.is_floating_point():
        raise ValueError("ring must be a floating-point tensor with a contiguous last dimension")
    if start.shape != (batch,) or start.is_floating_point() or start.device != ring.device:
        raise ValueError(f"start must be [B] = ({batch},) integers on the ring's device, got {tuple(start.shape)} "
                         f"{start.dtype} on {start.device}")  # fmt: skip
    query, key, value, g, beta = (x if x.stride(-1) == 1 else x.contiguous() for x in (query, key, value, g, beta))
    return torch.ops.hsv.gated_delta_ring(query, key, value, g, beta, ring, start, every_state)


def gated_delta_window(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`gated_delta_ring` from ``state`` ``[B, H_v, D_k, D_v]`` alone: ``(out [B, W, H_v, D_v]`` in ``value``'s
    dtype, ``states [B, W, H_v, D_k, D_v]`` float32, the state after every token``)``.

    Example:
        >>> q, k = torch.randn(1, 3, 1, 4), torch.randn(1, 3, 1, 4)
        >>> v, g, beta = torch.randn(1, 3, 2, 4), -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
        >>> out, states = gated_delta_window(q, k, v, g, beta, torch.zeros(1, 2, 4, 4))
        >>> out.shape, states.shape
        (torch.Size([1, 3, 2, 4]), torch.Size([1, 3, 2, 4, 4]))
    """
    _check(query, key, value, g, beta)
    batch, width, heads_v, d_v = value.shape
    if state.shape != (batch, heads_v, key.shape[3], d_v):
        raise ValueError(
            f"state must be [B, H_v, D_k, D_v] = {(batch, heads_v, key.shape[3], d_v)}, got {tuple(state.shape)}"
        )
    ring = torch.empty(batch, width + 1, *state.shape[1:], dtype=torch.float32, device=state.device)
    ring[:, 0] = state
    start = torch.ones(batch, dtype=torch.long, device=state.device)
    out = gated_delta_ring(query, key, value, g, beta, ring, start)
    return out, ring[:, 1:]
