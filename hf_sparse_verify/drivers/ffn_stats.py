"""Calibration of the sparse FFN (the sparse-verification paper §3.4): per-layer thresholds ``tau`` on ``|silu(gate(x))|`` such that a
chosen share of the channel activations falls under them on calibration prompts.

`FFNStats` hooks each replaceable MLP's ``gate_proj`` (a forward hook on the ``nn.Linear``, so it also sees MLPs
replaced by `GatedMLP` on paths that call ``gate_proj``; not the fused dense CUDA kernel: record with the plain
model) and counts ``|silu(gate_proj(x))|`` in a per-layer histogram with geometric bins (exact counts of every
value, no sample; a threshold is found to within one bin: a ratio of ``(high / low) ** (1 / bins)``, 0.5% by
default).

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...     num_attention_heads=2, vocab_size=50))
    >>> with FFNStats(model) as stats:
    ...     _ = model(torch.randint(0, 50, (2, 16)))
    >>> taus = stats.thresholds(0.5)
    >>> len(taus), abs(stats.share_under(0, taus[0]) - 0.5) < 0.01
    (2, True)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._compat import decoder_layers
from ..integrations.mlp import GatedMLP, replaceable_mlp


class FFNStats:
    """Per-layer histograms of ``|silu(gate(x))|`` over the tokens that run through ``model`` while attached.

    Args:
        model: a causal LM whose decoder layers hold Llama-family MLPs (`hf_sparse_verify.integrations.MLP_REPLACEABLE`).
        group: record the max over ``group`` consecutive tokens of a row instead of each value; with ``group = q``
            (the verify tokens per row) the recorded share is the share of channels a verify row skips. Default 1.
        bins / low / high: geometric bins on ``[low, high)``; values under ``low`` (zeros included) and from ``high``
            up get one bin each.

    Use as a context manager (hooks removed on exit) or call `attach` / `detach`.
    """

    def __init__(self, model: torch.nn.Module, *, group: int = 1, bins: int = 4096, low: float = 1e-6,
                 high: float = 1e3):  # fmt: skip
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be an int >= 1 (the verify tokens per row), got {group!r}")
        if not 0 < low < high or bins < 1:
            raise ValueError(f"need 0 < low < high and bins >= 1; got low={low}, high={high}, bins={bins}")
        layers = decoder_layers(model)
        if layers is None:
            raise ValueError(
                f"no decoder layers found in {type(model).__name__}: FFNStats needs model.model.layers"
            )
        self.mlps: dict[int, list[torch.nn.Module]] = {}
        for layer_idx, layer in enumerate(layers):
            found = [m for m in layer.modules() if isinstance(m, GatedMLP) or replaceable_mlp(m)]
            if found:
                self.mlps[layer_idx] = found
        if not self.mlps:
            raise ValueError(
                f"{type(model).__name__} has no bias-free SiLU gated MLP in its decoder layers; nothing to calibrate"
            )
        self.group = group
        self.edges = torch.logspace(
            math.log10(low), math.log10(high), bins + 1, dtype=torch.float64
        )  # [bins + 1]
        self.counts: dict[int, torch.Tensor] = {}  # layer -> [bins + 2] int64, on the layer's device
        self._handles: list = []

    def attach(self) -> FFNStats:
        for layer_idx, mlps in self.mlps.items():
            for mlp in mlps:
                hook = self._hook(layer_idx)
                self._handles.append(mlp.gate_proj.register_forward_hook(hook))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> FFNStats:
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def _hook(self, layer_idx: int):
        def record(module, inputs, output):
            with torch.no_grad():
                self.record(layer_idx, F.silu(output))  # replaceable MLPs' act_fn is SiLU

        return record

    def record(self, layer_idx: int, act: torch.Tensor) -> None:
        """Count the values of ``act`` ``[..., T, I]`` (gate activations) for layer ``layer_idx``."""
        values = act.abs().float()
        if self.group > 1:
            rows = values.reshape(-1, *values.shape[-2:])  # [B, T, I]
            tokens = rows.shape[1] // self.group * self.group
            rows = rows[:, :tokens].reshape(rows.shape[0], -1, self.group, rows.shape[2])
            values = rows.amax(dim=2)
        edges = self.edges.to(values.device, torch.float32)
        bucket = torch.bucketize(values.flatten(), edges, right=True)  # i: edges[i - 1] <= v < edges[i]
        counts = self.counts.get(layer_idx)
        if counts is None:
            counts = torch.zeros(self.edges.numel() + 1, dtype=torch.int64, device=values.device)
            self.counts[layer_idx] = counts
        counts.index_add_(0, bucket, torch.ones_like(bucket))

    def _cumulative(self, layer_idx: int) -> torch.Tensor:
        if layer_idx not in self.counts:
            raise RuntimeError(
                f"FFNStats recorded nothing for layer {layer_idx}: run calibration prompts first"
            )
        return self.counts[layer_idx].cpu().double().cumsum(0)  # [j]: values under edges[j]

    def threshold(self, layer_idx: int, sparsity: float) -> float:
        """``tau`` of one layer: a share ``sparsity`` of its recorded values lies under it."""
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {sparsity!r}")
        cum = self._cumulative(layer_idx)
        if sparsity == 0.0:
            return 0.0
        target = sparsity * float(cum[-1])
        j = int(torch.searchsorted(cum, torch.tensor([target], dtype=torch.float64))[0])
        if j == 0:
            return float(self.edges[0])  # the share lies under the lowest edge (mostly exact zeros)
        if j >= self.edges.numel():
            return float(self.edges[-1])
        lo, hi = float(self.edges[j - 1]), float(self.edges[j])
        in_bin = float(cum[j] - cum[j - 1])
        frac = (target - float(cum[j - 1])) / in_bin if in_bin > 0 else 1.0
        return lo * (hi / lo) ** frac  # geometric interpolation inside the bin

    def thresholds(self, sparsity: float) -> list[float]:
        """Per-layer ``tau`` (index = layer; 0.0 for layers without a replaceable MLP) such that a share
        ``sparsity`` of each layer's recorded activations falls under it."""
        count = max(self.mlps) + 1
        return [self.threshold(i, sparsity) if i in self.mlps else 0.0 for i in range(count)]

    def share_under(self, layer_idx: int, tau: float) -> float:
        """The recorded share of layer ``layer_idx``'s values under ``tau`` (read off the histogram: exact at bin
        edges, interpolated inside a bin)."""
        cum = self._cumulative(layer_idx)
        edges = self.edges
        if tau <= 0.0:
            return 0.0
        j = int(torch.searchsorted(edges, torch.tensor([tau], dtype=torch.float64), right=True)[0])
        if j == 0:
            return 0.0  # under the lowest edge: only the zeros bucket could be, and it is not split
        if j >= edges.numel():
            return float(cum[-2] / cum[-1])
        lo, hi = float(edges[j - 1]), float(edges[j])
        frac = math.log(tau / lo) / math.log(hi / lo)
        below = float(cum[j - 1]) + frac * float(cum[j] - cum[j - 1])
        return below / float(cum[-1])


def skipped_share(act: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """``[]`` float32: the share of channels the sparse FFN skips, averaged over rows (``act`` ``[B, q, I]``; a
    channel of a row is skipped when ``|act|`` is under ``tau`` for all of its ``q`` tokens)."""
    row_max = act.abs().amax(dim=1).float()  # [B, I]
    return (row_max < tau).float().mean()
