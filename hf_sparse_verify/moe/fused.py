"""The ``"hsv_fused"`` experts implementation: transformers' experts interface (`ExpertsInterface`) dispatching
the routed experts of a MoE layer to `hf_sparse_verify.kernels.fused_experts`.

transformers' ``@use_experts_implementation`` experts classes (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, ...) call the
function registered under ``config._experts_implementation`` as ``fn(module, hidden [T, H], top_k_index [T, k],
top_k_weights [T, k])``; `register` adds ours, and ``model.set_experts_implementation("hsv_fused")`` selects it
(`hf_sparse_verify.moe.experts_for_decoding` does so for decode and verify steps). Only the routed experts go through
the interface: a shared expert (Qwen2-MoE's ``shared_expert`` + ``shared_expert_gate``) stays the model's own dense
MLP, which already reads its weights once per step.

Experts modules the fused op does not compute exactly (biases, interleaved gate/up, another activation, a post-expert
norm, expert parallelism) fall back to transformers' ``batched_mm``. The attributes read here are the ones
``use_experts_implementation`` sets (checked on transformers 5.17).
"""

from __future__ import annotations

import torch
from transformers.activations import SiLUActivation
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from ..kernels.fused_experts import fused_experts

try:  # the gate every experts class gets unless it defines its own (transformers 5.17)
    from transformers.integrations.moe import _default_apply_gate
except ImportError:  # pragma: no cover - a later transformers: fall back to batched_mm everywhere
    _default_apply_gate = None

NAME = "hsv_fused"


def supports(module: torch.nn.Module) -> bool:
    """Whether ``module`` computes ``down(silu(gate(x)) * up(x))`` from concatenated ``gate_up_proj`` ``[E, 2I, H]``
    and ``down_proj`` ``[E, H, I]`` (or their transposes) without biases: the arithmetic of the fused op."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == 3
        and down.dim() == 3
        and getattr(module, "has_gate", False)
        and getattr(module, "is_concatenated", False)
        and not getattr(module, "has_bias", True)
        and not getattr(module, "has_post_expert_norm", True)
        and not getattr(module, "_is_expert_parallel", True)
        and isinstance(getattr(module, "act_fn", None), (torch.nn.SiLU, SiLUActivation))
        and _default_apply_gate is not None
        and getattr(type(module), "_apply_gate", None) is _default_apply_gate
    )


def fused_experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts forward of the ``"hsv_fused"`` implementation: ``hidden_states [T, H]``, ``top_k_index`` and
    ``top_k_weights`` ``[T, k]`` -> ``[T, H]`` in ``hidden_states.dtype``."""
    if not supports(self):
        return ALL_EXPERTS_FUNCTIONS["batched_mm"](self, hidden_states, top_k_index, top_k_weights)
    return fused_experts(
        hidden_states,
        self.gate_up_proj,
        self.down_proj,
        top_k_index,
        top_k_weights,
        transposed=self.is_transposed,
    )


def register() -> None:
    """Register `fused_experts_forward` under ``"hsv_fused"`` with transformers' `ExpertsInterface` (idempotent)."""
    ExpertsInterface.register(NAME, fused_experts_forward)
