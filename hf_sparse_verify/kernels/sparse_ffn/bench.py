"""Benchmark entries ``gated_act`` and ``sparse_ffn`` on the Llama-3.1-8B MLP (hidden 4096, intermediate 14336).

- ``gated_act``: ``silu(x @ gate^T) * (x @ up^T)`` for 1, 8 and 16 rows: ``triton`` (this folder's op) vs ``torch``
  (two matmuls, silu, mul: eager transformers). ``bytes_moved``: the gate and up weights plus activations.
- ``sparse_ffn``: the whole MLP of one verify row of ``q`` = 1, 8, 16 tokens with 50% / 75% of the channels skipped:
  ``triton`` (gate matmul + mask + sparse up/down, contiguous ``w_down_t``), ``triton_view`` (the same reading
  ``down_proj.weight.T`` in place: no copy, scattered reads) and ``torch_dense`` (the dense eager MLP).
  ``bytes_moved``: the gate weight plus the kept rows of up and down (what a sparse step must read).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..registry import KernelCase, register_benchmark
from .op import gate_activations, gated_act, sparse_ffn

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
    """The threshold that skips a share ``skipped`` of the channels of the row ``x`` ``[1, q, H]`` (setup only)."""
    row_max = gate_activations(x, w_gate).abs().amax(dim=1).float().flatten()  # [I]
    return torch.quantile(row_max.cpu(), skipped).to(x.device)


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
    for q_len in (1, 8, 16):
        x = torch.randn(1, q_len, hidden, device=device, dtype=dtype)
        dense_moved = (3 * inter * hidden + 2 * q_len * hidden) * size
        params = dict(q_len=q_len, hidden=hidden, inter=inter, skipped=0.0)
        yield KernelCase("sparse_ffn", "torch_dense", params, dense_moved,
                         functools.partial(_torch_mlp, x, w_gate, w_up, w_down))  # fmt: skip
        for skipped in (0.5, 0.75):
            tau = tau_for(x, w_gate, skipped)
            kept = inter - int(round(skipped * inter))
            moved = (inter * hidden + 2 * kept * hidden + 2 * q_len * hidden) * size
            params = dict(q_len=q_len, hidden=hidden, inter=inter, skipped=skipped)
            for variant, down in (("triton", w_down_t), ("triton_view", w_down.T)):
                run = functools.partial(sparse_ffn, x, w_gate, w_up, down, tau)
                yield KernelCase("sparse_ffn", variant, params, moved, run)
