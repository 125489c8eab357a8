"""Benchmark entries ``gated_act`` and ``sparse_ffn`` on the Llama-3.1-8B MLP (hidden 4096, intermediate 14336).

- ``gated_act``: ``silu(x @ gate^T) * (x @ up^T)`` for 1, 8 and 16 rows: ``triton`` (this folder's op) vs ``torch``
  (two matmuls, silu, mul: eager transformers). ``bytes_moved``: the gate and up weights plus activations.
- ``sparse_ffn``: the whole MLP of ``B`` verify rows of ``q`` tokens (1 x 1, 1 x 8, 1 x 16, 8 x 16) with 0% / 50% /
  75% of each row's channels skipped: ``triton`` (`sparse_gate_up` + `masked_down`, contiguous ``w_down_t``),
  ``triton_view`` (the same reading ``down_proj.weight.T`` in place: no copy, scattered reads; skipped shares > 0
  only), ``dense`` (what the verify step runs without sparsity: `gated_act` + a torch matmul up to 16 token rows,
  the eager MLP above) and ``torch_dense`` (the eager MLP). ``bytes_moved``: the gate weight plus the rows of up
  and down that some row keeps (what a sparse step must read; dense rows: all three weights).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..bench_registry import KernelCase, register_benchmark
from .op import FUSED_MAX_ROWS, gated_act, sparse_ffn

HIDDEN, INTER = 4096, 14336
QUICK = (64, 96)


def _weights(hidden, inter, device, dtype, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    w = [
        torch.randn(shape, generator=gen) * 0.02
        for shape in ((inter, hidden), (inter, hidden), (hidden, inter))
    ]
    return [t.to(device, dtype) for t in w]


def _torch_gated_act(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def _torch_mlp(x, w_gate, w_up, w_down):
    return F.linear(_torch_gated_act(x, w_gate, w_up), w_down)


def tau_for(x: torch.Tensor, w_gate: torch.Tensor, skipped: float) -> torch.Tensor:
    """The threshold that skips a share ``skipped`` of the (row, channel) pairs of ``x`` ``[B, q, H]``: a quantile of
    the rows' maxima over their tokens of ``|silu(gate)|`` (setup only)."""
    row_max = F.silu(F.linear(x, w_gate)).abs().amax(dim=1).float().flatten()  # [B * I]
    return torch.quantile(row_max.cpu()[: 2**24 - 1], skipped).to(x.device)


def _dense_step_mlp(x, w_gate, w_up, w_down):
    # what `GatedMLP` runs on CUDA
    rows = x.numel() // x.shape[-1]
    if x.is_cuda and rows <= FUSED_MAX_ROWS:
        return F.linear(gated_act(x, w_gate, w_up), w_down)
    return _torch_mlp(x, w_gate, w_up, w_down)


@register_benchmark("gated_act")
def gated_act_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    hidden, inter = QUICK if quick else (HIDDEN, INTER)
    w_gate, w_up, _ = _weights(hidden, inter, device, dtype)
    size = w_gate.element_size()
    for rows in (1, 8, 16):
        x = torch.randn(rows, hidden, device=device, dtype=dtype)
        moved = (2 * inter * hidden + rows * (hidden + inter)) * size
        params = dict(rows=rows, hidden=hidden, inter=inter)
        yield KernelCase("gated_act", "triton", params, moved, functools.partial(gated_act, x, w_gate, w_up))
        yield KernelCase(
            "gated_act", "torch", params, moved, functools.partial(_torch_gated_act, x, w_gate, w_up)
        )


@register_benchmark("sparse_ffn")
def sparse_ffn_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    hidden, inter = QUICK if quick else (HIDDEN, INTER)
    w_gate, w_up, w_down = _weights(hidden, inter, device, dtype)
    w_down_t = w_down.T.contiguous()
    size = w_gate.element_size()
    for batch, q_len in ((1, 1), (1, 8), (1, 16), (8, 16)):
        x = torch.randn(batch, q_len, hidden, device=device, dtype=dtype)
        dense_moved = (3 * inter * hidden + 2 * batch * q_len * hidden) * size
        params = dict(batch=batch, q_len=q_len, hidden=hidden, inter=inter, skipped=0.0)
        for variant, fn in (("dense", _dense_step_mlp), ("torch_dense", _torch_mlp)):
            run = functools.partial(fn, x, w_gate, w_up, w_down)
            yield KernelCase("sparse_ffn", variant, params, dense_moved, run)
        for skipped in (0.0, 0.5, 0.75):
            tau = tau_for(x, w_gate, skipped) if skipped else torch.zeros((), device=device)
            act = F.silu(F.linear(x, w_gate)).abs().amax(dim=1)  # [B, I]
            used = int((act.float() >= tau).any(0).sum())  # channels some row keeps
            moved = (inter * hidden + 2 * used * hidden + 2 * batch * q_len * hidden) * size
            params = dict(batch=batch, q_len=q_len, hidden=hidden, inter=inter, skipped=skipped, used=used)
            variants = (
                (("triton", w_down_t), ("triton_view", w_down.T)) if skipped else (("triton", w_down_t),)
            )
            for variant, down in variants:
                run = functools.partial(sparse_ffn, x, w_gate, w_up, down, tau)
                yield KernelCase("sparse_ffn", variant, params, moved, run)
