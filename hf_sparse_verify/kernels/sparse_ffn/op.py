"""``hsv::gated_act``, ``hsv::sparse_gate_up``, ``hsv::masked_down`` and ``hsv::sparse_ffn``: validation, registration with
``torch.library``, Triton where it runs, the reference elsewhere (CPU without ``TRITON_INTERPRET=1``, float64)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import gated_act_naive, masked_down_naive, sparse_gate_up_naive

#: `hf_sparse_verify.integrations.mlp.GatedMLP` runs the fused ``silu(gate) * up`` kernel for steps of at most this many token rows (batch x new tokens); larger
#: steps use torch's matmuls. Measured on an H200 (8B shape), in separate runs, not side by side: fused is faster at 1
#: and 16 rows (decode 6.13 -> 5.81 ms at 1K, a 16-token verify 6.57 -> 6.27 ms), slower from 80 rows (16 x 16K
#: verify of 5 / 7 / 9 tokens: 16.0 / 16.3 / 17.1 ms unfused, `results/step.json (record 8b_16x16k_vegas_scores)`; 16.9 /
#: 18.4 / 20.1 ms fused, `results/step.json (record 8b_16x16k_vegas_scores_rowdot)`).
FUSED_MAX_ROWS = 16

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _use_triton(x: torch.Tensor) -> bool:
    return triton_runs_on(x.device) and x.dtype != torch.float64


@torch.library.custom_op("hsv::gated_act", mutates_args=())
def _gated_act_op(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    if _use_triton(x):
        from .kernel import gated_act_launch

        return gated_act_launch(x, w_gate, w_up)
    return gated_act_naive(x, w_gate, w_up)


@_gated_act_op.register_fake
def _(x, w_gate, w_up):
    return x.new_empty((x.shape[0], w_gate.shape[0]))


@torch.library.custom_op("hsv::sparse_gate_up", mutates_args=())
def _sparse_gate_up_op(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, tau: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(x):
        from .kernel import sparse_gate_up_launch

        h, keep = sparse_gate_up_launch(x, w_gate, w_up, tau)
        return h, keep.view(torch.bool)
    return sparse_gate_up_naive(x, w_gate, w_up, tau)


@_sparse_gate_up_op.register_fake
def _(x, w_gate, w_up, tau):
    inter = w_gate.shape[0]
    return x.new_empty((*x.shape[:2], inter)), x.new_empty((x.shape[0], inter), dtype=torch.bool)


@torch.library.custom_op("hsv::masked_down", mutates_args=())
def _masked_down_op(h: torch.Tensor, w_down_t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    if _use_triton(h):
        from .kernel import masked_down_launch

        return masked_down_launch(h, w_down_t, keep)
    return masked_down_naive(h, w_down_t, keep)


@_masked_down_op.register_fake
def _(h, w_down_t, keep):
    return h.new_empty((*h.shape[:2], w_down_t.shape[1]))


@torch.library.custom_op("hsv::sparse_ffn", mutates_args=())
def _sparse_ffn_op(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, tau: torch.Tensor
) -> torch.Tensor:
    if _use_triton(x):
        from .kernel import sparse_ffn_launch

        return sparse_ffn_launch(x, w_gate, w_up, w_down_t, tau)
    h, keep = sparse_gate_up_naive(x, w_gate, w_up, tau)
    return masked_down_naive(h, w_down_t, keep)


@_sparse_ffn_op.register_fake
def _(x, w_gate, w_up, w_down_t, tau):
    return x.new_empty((*x.shape[:2], w_down_t.shape[1]))


def _same_device(*tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device; got {sorted(map(str, devices))}")


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def gated_act(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w_gate.T) * (x @ w_up.T)`` in one launch: gate and up read in one pass, float32 accumulation,
    output in ``x.dtype`` (see `gated_act_naive` for the rounding).

    Args:
        x: ``[..., H]`` (decode / verify rows: 1..64 in practice; each weight is read once for up to 64 rows).
        w_gate, w_up: ``[I, H]`` (``nn.Linear`` weights), same dtype as ``x``.

    Returns:
        ``[..., I]`` in ``x.dtype``.

    Example:
        >>> x, wg, wu = torch.randn(3, 32), torch.randn(48, 32), torch.randn(48, 32)
        >>> torch.allclose(gated_act(x, wg, wu), gated_act_naive(x, wg, wu), atol=1e-5)
        True
    """
    if x.dim() < 1 or w_gate.dim() != 2 or w_up.shape != w_gate.shape or w_gate.shape[1] != x.shape[-1]:
        raise ValueError(
            "gated_act needs x [..., H] and w_gate, w_up [I, H] (nn.Linear weights); got "
            f"{tuple(x.shape)}, {tuple(w_gate.shape)}, {tuple(w_up.shape)}"
        )
    if x.dtype not in _FLOAT_DTYPES or w_gate.dtype != x.dtype or w_up.dtype != x.dtype:
        raise ValueError(
            f"x and the weights must share one float dtype; got {x.dtype}, {w_gate.dtype}, {w_up.dtype} (cast the "
            "activations to the weights' dtype)"
        )
    _same_device(x, w_gate, w_up)
    rows = _unit_last(x).reshape(-1, x.shape[-1])
    out = torch.ops.hsv.gated_act(rows, _unit_last(w_gate), _unit_last(w_up))
    return out.view(*x.shape[:-1], w_gate.shape[0])


def sparse_gate_up(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, tau: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """First half of the sparse FFN of a verify step (the sparse-verification paper §3.4): gate activations, one channel mask per batch
    row, and ``h = silu(gate) * up`` over the kept channels, reading only the rows of ``w_up`` that some row keeps.

    Args:
        x: ``[B, q, H]`` (``B`` batch rows of ``q`` verify tokens, ``q <= 128``).
        w_gate, w_up: ``[I, H]`` (``nn.Linear`` weights), same dtype as ``x``.
        tau: ``[]`` float32 threshold on ``|silu(gate)|``, on ``x``'s device (``0`` keeps every channel).

    Returns:
        ``h`` ``[B, q, I]`` in ``x.dtype``, zero where the token's row skips the channel, and ``keep`` ``[B, I]``
        bool: channel ``i`` of row ``b`` is kept when ``max_t |silu(gate(x))[b, t, i]| >= tau`` (compared in
        float32).

    Example:
        >>> x, wg, wu = torch.randn(2, 3, 16), torch.randn(24, 16), torch.randn(24, 16)
        >>> h, keep = sparse_gate_up(x, wg, wu, torch.tensor(0.0))  # tau 0: the dense product
        >>> bool(keep.all()), torch.allclose(h, F.silu(x @ wg.T) * (x @ wu.T), atol=1e-5)
        (True, True)
    """
    tau = _check_gate_up("sparse_gate_up", x, w_gate, w_up, tau)
    return torch.ops.hsv.sparse_gate_up(_unit_last(x), _unit_last(w_gate), _unit_last(w_up), tau)


def _check_gate_up(name: str, x, w_gate, w_up, tau) -> torch.Tensor:
    """Validates the gate/up inputs of ``name``; returns ``tau`` as a float32 scalar tensor on ``x``'s device."""
    if x.dim() != 3 or w_gate.dim() != 2 or w_up.shape != w_gate.shape or w_gate.shape[1] != x.shape[-1]:
        raise ValueError(
            f"{name} needs x [B, q, H] (reshape the MLP input to [batch rows, verify tokens, hidden]) and "
            f"w_gate, w_up [I, H]; got {tuple(x.shape)}, {tuple(w_gate.shape)}, {tuple(w_up.shape)}"
        )
    if x.shape[1] > 128:
        raise ValueError(f"{name} takes at most 128 verify tokens per row; got {x.shape[1]}")
    if x.dtype not in _FLOAT_DTYPES or w_gate.dtype != x.dtype or w_up.dtype != x.dtype:
        raise ValueError(
            f"x and the weights must share one float dtype; got {x.dtype}, {w_gate.dtype}, {w_up.dtype}"
        )
    tau = torch.as_tensor(tau, dtype=torch.float32, device=x.device)
    if tau.dim() != 0:
        raise ValueError(f"tau must be a scalar (one threshold per layer); got shape {tuple(tau.shape)}")
    _same_device(x, w_gate, w_up)
    return tau


def masked_down(h: torch.Tensor, w_down_t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Second half of the sparse FFN: ``y = h @ w_down_t``, reading a row of ``w_down_t`` only where some batch row
    keeps the channel (``h`` must be zero where its row does not: what `sparse_gate_up` returns).

    Args:
        h: ``[B, q, I]``.
        w_down_t: ``[I, H]``: ``down_proj.weight.T``. A contiguous copy reads each kept channel as one contiguous
            row; the transposed view of ``down_proj.weight`` (no extra memory) gives the same result with scattered
            reads (slower on a GPU).
        keep: ``[B, I]`` bool (from `sparse_gate_up`).

    Returns:
        ``[B, q, H]`` in ``h.dtype``.

    Example:
        >>> x, wg, wu, wd = torch.randn(2, 3, 16), torch.randn(24, 16), torch.randn(24, 16), torch.randn(16, 24)
        >>> h, keep = sparse_gate_up(x, wg, wu, torch.tensor(0.5))
        >>> y = masked_down(h, wd.T, keep)
        >>> torch.allclose(y, (F.silu(x @ wg.T) * (x @ wu.T) * keep[:, None]) @ wd.T, atol=1e-4)
        True
    """
    if h.dim() != 3 or w_down_t.dim() != 2 or w_down_t.shape[0] != h.shape[2]:
        raise ValueError(
            f"masked_down needs h [B, q, I] and w_down_t [I, H] (pass down_proj.weight.T, not down_proj.weight); "
            f"got {tuple(h.shape)} and {tuple(w_down_t.shape)}"
        )
    if keep.shape != (h.shape[0], h.shape[2]) or keep.dtype != torch.bool:
        raise ValueError(
            f"keep must be bool [B, I] = [{h.shape[0]}, {h.shape[2]}] (from sparse_gate_up); got "
            f"{tuple(keep.shape)} {keep.dtype}"
        )
    if h.dtype not in _FLOAT_DTYPES or w_down_t.dtype != h.dtype:
        raise ValueError(f"h and w_down_t must share one float dtype; got {h.dtype}, {w_down_t.dtype}")
    _same_device(h, w_down_t, keep)
    return torch.ops.hsv.masked_down(_unit_last(h), w_down_t, _unit_last(keep))


def sparse_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, tau: torch.Tensor
) -> torch.Tensor:
    """The sparse gated MLP of a verify step (the sparse-verification paper §3.4): dense gate activations, one channel mask per batch
    row (channel kept when its ``|silu(gate)|`` reaches ``tau`` for one of the row's tokens), up and down over the
    channels some row keeps only. On the GPU: the gate pass writes the masks, one program lists the kept channels
    (no host sync), and up and down loop over that list, so a skipped channel costs neither a read nor a step (four
    launches, five when the down projection is split). ``x`` ``[B, q, H]``, ``w_gate`` / ``w_up`` / ``w_down_t``
    ``[I, H]``, ``tau`` ``[]`` float32 -> ``[B, q, H]``. ``tau = 0`` gives the dense MLP.

    Example:
        >>> x, wg, wu, wd = torch.randn(2, 3, 16), torch.randn(24, 16), torch.randn(24, 16), torch.randn(16, 24)
        >>> y = sparse_ffn(x, wg, wu, wd.T, torch.tensor(0.0))
        >>> torch.allclose(y, (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T, atol=1e-4)
        True
    """
    tau = _check_gate_up("sparse_ffn", x, w_gate, w_up, tau)
    if w_down_t.dim() != 2 or tuple(w_down_t.shape) != (w_gate.shape[0], x.shape[2]):
        raise ValueError(
            f"sparse_ffn needs w_down_t [I, H] = [{w_gate.shape[0]}, {x.shape[2]}] (pass down_proj.weight.T, not "
            f"down_proj.weight); got {tuple(w_down_t.shape)}"
        )
    if w_down_t.dtype != x.dtype:
        raise ValueError(f"w_down_t must have x's dtype {x.dtype}; got {w_down_t.dtype}")
    _same_device(x, w_down_t)
    return torch.ops.hsv.sparse_ffn(_unit_last(x), _unit_last(w_gate), _unit_last(w_up), w_down_t, tau)
