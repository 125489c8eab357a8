"""``hsv::gated_act`` and ``hsv::sparse_up_down``: validation, registration with ``torch.library``, Triton where it
runs, the reference elsewhere (CPU without ``TRITON_INTERPRET=1``, float64); `kept_channels` (plain tensor ops)
turns gate activations into the compacted per-row channel lists the sparse kernels read."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._triton import triton_runs_on
from .naive import channel_mask_naive, gated_act_naive, sparse_up_down_naive

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


@torch.library.custom_op("hsv::sparse_up_down", mutates_args=())
def _sparse_up_down_op(
    x: torch.Tensor,
    act: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    index: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    if _use_triton(x):
        from .kernel import sparse_up_down_launch

        return sparse_up_down_launch(x, act, w_up, w_down_t, index, count)
    return sparse_up_down_naive(x, act, w_up, w_down_t, index, count)


@_sparse_up_down_op.register_fake
def _(x, act, w_up, w_down_t, index, count):
    return x.new_empty(x.shape)


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


def gate_activations(x: torch.Tensor, w_gate: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w_gate.T)`` rounded as eager rounds it: ``x`` ``[..., H]``, ``w_gate`` ``[I, H]`` -> ``[..., I]``."""
    return F.silu(F.linear(x, w_gate))


def kept_channels(act: torch.Tensor, tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The channels each row keeps, compacted: channel ``i`` of row ``b`` is kept when ``max_t |act[b, t, i]| >=
    tau``. Device tensor ops only (no host sync; shapes fixed by ``act``).

    Args:
        act: ``[B, q, I]`` gate activations ``silu(gate(x))``.
        tau: ``[]`` float32 threshold on ``act``'s device (a float is accepted).

    Returns:
        ``index [B, I]`` int32, the kept channel ids of each row in increasing order (entries past ``count[b]`` are
        0), and ``count [B]`` int32.

    Example:
        >>> act = torch.tensor([[[0.1, -2.0, 0.0], [0.5, 0.0, 0.0]]])  # [1, 2, 3]
        >>> index, count = kept_channels(act, torch.tensor(0.4))
        >>> index.tolist(), count.tolist()
        ([[0, 1, 0]], [2])
    """
    if act.dim() != 3:
        raise ValueError(f"kept_channels needs act [B, q, I]; got {tuple(act.shape)}")
    batch, _, inter = act.shape
    keep = channel_mask_naive(act, tau)  # [B, I]
    count = keep.sum(-1, dtype=torch.int32)  # [B]
    slot = torch.cumsum(keep, -1, dtype=torch.int32) - 1  # [B, I] slot of each kept channel
    target = torch.where(keep, slot, inter).long()  # skipped channels go to a spare column
    channels = torch.arange(inter, dtype=torch.int32, device=act.device).expand(batch, inter)
    index = torch.zeros(batch, inter + 1, dtype=torch.int32, device=act.device)
    index.scatter_(1, target, channels)
    return index[:, :inter].contiguous(), count


def sparse_up_down(
    x: torch.Tensor,
    act: torch.Tensor,
    w_up: torch.Tensor,
    w_down_t: torch.Tensor,
    index: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """Up and down projections over each row's kept channels only:
    ``y[b, t] = sum_{s < count[b]} act[b, t, c] * (x[b, t] . w_up[c]) * w_down_t[c]`` with ``c = index[b, s]``.

    Args:
        x: ``[B, q, H]`` (``B`` batch rows of ``q`` verify tokens).
        act: ``[B, q, I]`` gate activations (same dtype as ``x``).
        w_up: ``[I, H]`` (``up_proj.weight``).
        w_down_t: ``[I, H]``: ``down_proj.weight.T``. A contiguous copy reads each kept channel as one contiguous
            row; the transposed view of ``down_proj.weight`` (no extra memory) gives the same result with scattered
            reads (slower on a GPU).
        index, count: from `kept_channels` (int32 or int64).

    Returns:
        ``[B, q, H]`` in ``x.dtype``.

    Example:
        >>> x, act = torch.randn(2, 3, 16), torch.randn(2, 3, 24)
        >>> w_up, w_down = torch.randn(24, 16), torch.randn(16, 24)
        >>> index, count = kept_channels(act, torch.tensor(0.0))  # every channel kept
        >>> y = sparse_up_down(x, act, w_up, w_down.T, index, count)
        >>> torch.allclose(y, (act * (x @ w_up.T)) @ w_down.T, atol=1e-4)
        True
    """
    if x.dim() != 3 or act.dim() != 3 or act.shape[:2] != x.shape[:2]:
        raise ValueError(
            f"sparse_up_down needs x [B, q, H] and act [B, q, I]; got {tuple(x.shape)} and {tuple(act.shape)} "
            "(reshape the MLP input to [batch rows, verify tokens, hidden])"
        )
    batch, _, hidden = x.shape
    inter = act.shape[2]
    if w_up.shape != (inter, hidden) or w_down_t.shape != (inter, hidden):
        raise ValueError(
            f"w_up and w_down_t must be [I, H] = [{inter}, {hidden}] (pass down_proj.weight.T, not down_proj.weight); "
            f"got {tuple(w_up.shape)} and {tuple(w_down_t.shape)}"
        )
    if (
        index.shape != (batch, inter)
        or count.shape != (batch,)
        or index.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(
            f"index must be [B, I] = [{batch}, {inter}] and count [B] = [{batch}], int32 (from kept_channels); got "
            f"{tuple(index.shape)} {index.dtype} and {tuple(count.shape)} {count.dtype}"
        )
    if count.dtype != index.dtype:
        raise ValueError(f"index and count must share one int dtype; got {index.dtype} and {count.dtype}")
    if x.dtype not in _FLOAT_DTYPES or any(t.dtype != x.dtype for t in (act, w_up, w_down_t)):
        raise ValueError(
            f"x, act, w_up and w_down_t must share one float dtype; got {x.dtype}, {act.dtype}, {w_up.dtype}, "
            f"{w_down_t.dtype}"
        )
    _same_device(x, act, w_up, w_down_t, index, count)
    return torch.ops.hsv.sparse_up_down(
        _unit_last(x), _unit_last(act), _unit_last(w_up), w_down_t, index.contiguous(), count.contiguous()
    )


def sparse_ffn(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down_t: torch.Tensor, tau: torch.Tensor
) -> torch.Tensor:
    """The sparse gated MLP of a verify step (papers/000 §3.4): dense gate activations, one channel mask per batch
    row (channel kept when its ``|silu(gate)|`` reaches ``tau`` for one of the row's tokens), up and down over the
    kept channels only. ``x`` ``[B, q, H]``, ``w_gate`` / ``w_up`` / ``w_down_t`` ``[I, H]``, ``tau`` ``[]`` float32
    -> ``[B, q, H]``. ``tau = 0`` gives the dense MLP.

    Example:
        >>> x, wg, wu, wd = torch.randn(2, 3, 16), torch.randn(24, 16), torch.randn(24, 16), torch.randn(16, 24)
        >>> y = sparse_ffn(x, wg, wu, wd.T, torch.tensor(0.0))
        >>> torch.allclose(y, (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T, atol=1e-4)
        True
    """
    act = gate_activations(x, w_gate)  # [B, q, I]
    index, count = kept_channels(act, tau)
    return sparse_up_down(x, act, w_up, w_down_t, index, count)
