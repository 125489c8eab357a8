"""Experts implementation for decoding steps, through transformers' public experts API.

transformers' own decoding loop (`GenerationMixin._sample`) switches MoE models from the ``grouped_mm`` experts
implementation to ``batched_mm`` after the prefill on non-CPU devices, because ``batched_mm`` is much faster on
the few tokens of a decode step. hf_sparse_verify runs its own loop, so it makes a switch for its draft, verify and
decode steps (a verify step has at most ``max_draft_tokens + 1`` tokens per row): to our fused Triton experts
(``"hsv_fused"``, `hf_sparse_verify.integrations.fused_experts`) on CUDA, which read each selected expert once per step and can be
captured in a CUDA graph; to ``batched_mm`` on other accelerators. Measured on an H200 before the ``batched_mm``
switch (code-moe, bf16, batch 1): our K = 0 path ran at 0.76x plain ``generate``; ``batched_mm`` then copies one
expert per (token, expert) pair (Qwen3-30B-A3B shape, 1K context: decode step 8.4 ms, 5.65x its bandwidth floor).
"""

from __future__ import annotations

import logging

import torch

from ..kernels._triton import triton_runs_on
from ..placement import dtensor_weights
from . import fused_experts as fused

logger = logging.getLogger(__name__)


def _implementations(model) -> dict | None:
    getter = getattr(model, "get_experts_implementation", None)
    if getter is None:
        return None
    try:
        return getter()
    except (AttributeError, ValueError):
        return None


#: the fused Triton experts are the CUDA default for decoding steps. Round 2, first session: the kernel tests passed on
#: an H200 but the end-to-end tests never reached the kernel, because only ``grouped_mm`` was switched and models built
#: there defaulted to ``eager``; both defaults are switched now (`SWITCHED`).
FUSED_BY_DEFAULT = True

#: experts implementations replaced for decoding steps: transformers' defaults (``grouped_mm`` where torch has it,
#: else ``eager``). A ``batched_mm`` chosen by the user is kept.
SWITCHED = ("grouped_mm", "eager")


def decoding_implementation(device: torch.device, use_fused: bool | None = None) -> str | None:
    """The experts implementation for decoding steps on ``device``: ``"hsv_fused"`` where asked for
    (``use_fused=True``, or by default on CUDA with Triton once `FUSED_BY_DEFAULT` is on); else ``"batched_mm"`` off
    CPU and None (keep the model's own) on CPU."""
    if use_fused is None:
        use_fused = FUSED_BY_DEFAULT and device.type == "cuda" and triton_runs_on(device)
    if use_fused:
        return fused.NAME
    return None if device.type == "cpu" else "batched_mm"


def decoding_plan(model: torch.nn.Module, use_fused: bool | None, expert_skipping: bool) -> dict | None:
    """The experts implementations ``model`` switches to for decoding steps (None: no change).

    Every ``grouped_mm`` or ``eager`` experts implementation (transformers' defaults) becomes the decoding one of
    `decoding_implementation`: our fused Triton experts on CUDA, ``batched_mm`` on other non-CPU devices, unchanged
    on CPU unless ``use_fused=True``. Other choices (``batched_mm`` set by the user) are kept. Tensor-parallel
    models keep transformers' sharded experts and their collectives.

    ``expert_skipping=True`` (lossy sparse verification with `SparseMoE`): every experts implementation, on every
    device and whatever the user chose, becomes ``"hsv_fused"``, the only one that applies a verify step's
    `MoESkip` (on CPU and where Triton cannot run, the op computes its plain PyTorch reference: right results, no
    saving). Models switched to ``"hsv_fused"`` get their experts' layer indices recorded (`fused.record_layers`).
    `hf_sparse_verify.integrations.switch.Switched.decoding_experts` applies the plan and undoes it.
    """
    original = _implementations(model)
    if not original or dtensor_weights(model):
        return None
    if expert_skipping:
        name, replaced = fused.NAME, {k for k, v in original.items() if v is not None}
    else:
        if not any(v in SWITCHED for v in original.values()):
            return None
        name = decoding_implementation(next(model.parameters()).device, use_fused)
        replaced = {k for k, v in original.items() if v in SWITCHED}
    if name is None:
        return None
    if name == fused.NAME:
        fused.register()
        fused.record_layers(model)
    return {k: name if k in replaced else v for k, v in original.items()}
