"""The ``"hsv_fused"`` experts implementation: transformers' experts interface (`ExpertsInterface`) dispatching
the routed experts of a MoE layer to `hf_sparse_verify.kernels.fused_experts`.

transformers' ``@use_experts_implementation`` experts classes (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE, ...) call the
function registered under ``config._experts_implementation`` as ``fn(module, hidden [T, H], top_k_index [T, k],
top_k_weights [T, k])``; `register` adds ours, and ``model.set_experts_implementation("hsv_fused")`` selects it
(`hf_sparse_verify.integrations.Switched.decoding_experts` does so for decode and verify steps). Only the routed experts go through
the interface: a shared expert (Qwen2-MoE's ``shared_expert`` + ``shared_expert_gate``) stays the model's own dense
MLP, which already reads its weights once per step.

Experts modules the fused op does not compute exactly (biases, interleaved gate/up, another activation, a post-expert
norm, expert parallelism) fall back to transformers' ``batched_mm``. The attributes read here are the ones
``use_experts_implementation`` sets (checked on transformers 5.17).

Expert skipping (lossy sparse verification, the sparse-verification paper §3.5): in a verify step whose `VerifySparsity` slot gives
the module's layer a `MoESkip`, each token keeps only its ``n_active`` highest-weight experts
(`hf_sparse_verify.kernels.expert_skip.naive.skip_counts`), or under ``"row_union"`` its experts in its row's shared set
(`hf_sparse_verify.kernels.expert_skip.naive.row_union`); the kept weights are not renormalised. Experts modules carry no layer
index, so `record_layers` notes each one's decoder layer when a model is switched to this implementation
(`experts_for_decoding`).
"""

from __future__ import annotations

import weakref

import torch
from transformers.activations import SiLUActivation
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

from .._compat import experts_layers
from .._logging import warn_once
from ..kernels.expert_skip import expert_skip
from ..kernels.expert_skip.naive import active_mask
from ..kernels.fused_experts import fused_experts
from ..step.context import current_step
from ..step.slots import MoESkip

try:  # the gate every experts class gets unless it defines its own (newer transformers)
    from transformers.integrations.moe import _default_apply_gate
except ImportError:  # pragma: no cover - transformers without the hook: gating is the plain chunk + SiLU
    _default_apply_gate = None

NAME = "hsv_fused"


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why the fused op cannot compute ``module`` exactly (None when it can): it computes
    ``down(silu(gate(x)) * up(x))`` from concatenated ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``
    (or their transposes) without biases.

    Attributes that ``use_experts_implementation`` sets only on newer transformers (``has_post_expert_norm``,
    ``_is_expert_parallel``, a custom ``_apply_gate``) count as absent features when they are missing: on
    transformers 5.17 the strict reading of them sent every module to ``batched_mm`` without a word."""
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor)):
        return "no gate_up_proj / down_proj expert tensors"
    if gate_up.dim() != 3 or down.dim() != 3:
        return f"expert tensors of {gate_up.dim()} and {down.dim()} dims (need [E, ., .])"
    if not getattr(module, "has_gate", True) or not getattr(module, "is_concatenated", True):
        return "gate and up are not one concatenated projection"
    if getattr(module, "has_bias", False) or getattr(module, "gate_up_proj_bias", None) is not None:
        return "expert biases"
    if getattr(module, "has_post_expert_norm", False):
        return "a post-expert norm"
    if getattr(module, "_is_expert_parallel", False):
        return "expert parallelism"
    if not isinstance(getattr(module, "act_fn", None), (torch.nn.SiLU, SiLUActivation)):
        return f"activation {type(getattr(module, 'act_fn', None)).__name__} (need SiLU)"
    gate = getattr(type(module), "_apply_gate", None)
    if gate is not None and gate is not _default_apply_gate:
        return "a custom _apply_gate"
    return None


def supports(module: torch.nn.Module) -> bool:
    """Whether the fused op computes ``module`` exactly (see `unsupported_reason`)."""
    return unsupported_reason(module) is None


#: decoder layer index of each experts module switched to this implementation (`record_layers`)
_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def record_layers(model: torch.nn.Module) -> None:
    """Note the decoder layer index of every experts module of ``model`` (idempotent), for `moe_skip` lookups."""
    _LAYERS.update(experts_layers(model))


def layer_skip(module: torch.nn.Module) -> MoESkip | None:
    """The `MoESkip` the running verify step gives ``module``'s layer, or None (dense: no step, a lossless step, or a
    layer without skipping)."""
    step = current_step(required=False)
    sparsity = step.sparsity() if step is not None else None
    if sparsity is None:
        return None
    layer = _LAYERS.get(module)
    if layer is None:
        raise RuntimeError(
            f"{type(module).__name__} has no recorded layer index, so expert skipping cannot look up its layer: "
            f"switch the model with hf_sparse_verify.integrations.Switched.decoding_experts(model, expert_skipping=True)"
        )
    return sparsity.moe_skip(layer)


def fused_experts_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The experts forward of the ``"hsv_fused"`` implementation: ``hidden_states [T, H]``, ``top_k_index`` and
    ``top_k_weights`` ``[T, k]`` -> ``[T, H]`` in ``hidden_states.dtype``. With ``residual`` ``[T, H]`` (our
    `hf_sparse_verify.integrations.FusedDecoderLayer` calls it so, transformers never does) the result is
    ``residual + experts``, added in the op's last launch.

    Under expert skipping (`layer_skip`), the pairs are put in weight order and each token's ``n_active`` is
    counted (`hf_sparse_verify.kernels.expert_skip`: `order_by_weight` and `skip_counts` in one launch), and the
    fused op gets ``n_active``, so it neither loads nor
    computes the skipped pairs. Modules the op declines run ``batched_mm`` with the skipped pairs' weights zeroed:
    the same result, but no work saved."""
    skip = layer_skip(self)
    n_active = None
    if skip is not None:  # order_by_weight + skip_counts (or row_union) in one launch where Triton runs
        # row_union's rows: a verify row's q_len tokens are consecutive in [T, H]
        group = skip.group or current_step().q_len
        top_k_index, top_k_weights, n_active = expert_skip(
            top_k_index, top_k_weights, skip, group
        )  # n_active [T] int32
    reason = unsupported_reason(self)
    if reason is not None:
        warn_once(
            f"fused_experts:{type(self).__name__}",
            f"hf_sparse_verify: {type(self).__name__} runs transformers' batched_mm experts, not the fused Triton "
            f"experts ({reason})",
        )
        if n_active is not None:
            kept = active_mask(n_active, top_k_weights.shape[1])
            top_k_weights = torch.where(kept, top_k_weights, torch.zeros_like(top_k_weights))
        out = ALL_EXPERTS_FUNCTIONS["batched_mm"](self, hidden_states, top_k_index, top_k_weights)
        return out if residual is None else residual + out
    return fused_experts(
        hidden_states,
        self.gate_up_proj,
        self.down_proj,
        top_k_index,
        top_k_weights,
        n_active,
        transposed=self.is_transposed,
        residual=residual,
    )


def register() -> None:
    """Register `fused_experts_forward` under ``"hsv_fused"`` with transformers' `ExpertsInterface` (idempotent)."""
    ExpertsInterface.register(NAME, fused_experts_forward)
