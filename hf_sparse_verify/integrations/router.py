"""`FusedRouter`: transformers' MoE top-k routers on the one-launch kernel of `hf_sparse_verify.kernels.moe_router`.

A decode step of Qwen3-30B-A3B on an H200 spends ~0.75 ms of 5.56 ms in the eager router (``F.linear``, softmax,
``torch.topk``'s two kernels, the sum, the division and casts: ~6 small kernels per layer over 48 layers). For CUDA
steps of at most `MAX_ROWS` token rows the replacement runs the op `hf_sparse_verify.kernels.moe_router.moe_router`
(by default one launch that also computes the logits, float32 accumulation, so they are no longer bitwise cuBLAS's;
``kernel.LOGITS_IN_KERNEL = False`` keeps ``F.linear`` + one routing launch); everywhere else it computes
transformers' arithmetic, so CPU results are bitwise what transformers computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels._triton import compiled_on
from ..kernels.moe_router import moe_router
from ..kernels.moe_router.op import MAX_EXPERTS, MAX_TOP_K

#: router classes whose forward is ``F.linear`` -> float32 softmax -> ``torch.topk`` -> optional division by the
#: float32 sum -> cast to the logits dtype (checked against transformers 5.23.0's source, Qwen3-Next's against 5.24.0's; tests compare each with
#: its replacement). `FLOAT32_SCORES` ones always renormalize and keep float32 scores.
REPLACEABLE = frozenset(
    {"Qwen3MoeTopKRouter", "Qwen3NextTopKRouter", "Qwen2MoeTopKRouter", "OlmoeTopKRouter", "MixtralTopKRouter"}
)
FLOAT32_SCORES = frozenset({"MixtralTopKRouter"})
#: the routing kernel runs for steps of at most this many token rows (decode and verify); prefills keep
#: transformers' arithmetic
MAX_ROWS = 16


def replaceable_router(module: torch.nn.Module) -> bool:
    """Whether `FusedRouter` computes exactly what ``module`` computes: an allow-listed class holding only its
    ``[num_experts, hidden_dim]`` weight (no bias, no submodules, no hooks the replacement would drop, no
    ``jitter_noise``; transformers keeps Mixtral's jitter in the sparse block, which stays in place), with
    ``1 <= top_k <= num_experts`` and a boolean ``norm_topk_prob`` where the class has one."""
    name = type(module).__name__
    if name not in REPLACEABLE:
        return False
    params = dict(module.named_parameters())
    weight = params.get("weight")
    if set(params) != {"weight"} or list(module.children()) or list(module.buffers()):
        return False
    if module._forward_hooks or module._forward_pre_hooks or getattr(module, "jitter_noise", 0):
        return False
    try:
        shape_ok = tuple(weight.shape) == (module.num_experts, module.hidden_dim)
        top_k_ok = 1 <= module.top_k <= module.num_experts
        norm_ok = name in FLOAT32_SCORES or isinstance(module.norm_topk_prob, bool)
    except AttributeError:
        return False
    return shape_ok and top_k_ok and norm_ok


#: whether `FusedRouter` sends steps on a device to the kernel (compiled Triton on CUDA); one name to patch in tests
fused_router_runs = compiled_on


class FusedRouter(torch.nn.Module):
    """Stand-in for a transformers MoE top-k router; shares the original's ``weight`` (same state-dict key, no
    copy) and returns the same ``(router_logits [T, E], router_scores [T, k], router_indices [T, k])``.

    Args:
        original: a router for which `replaceable_router` holds.

    Example:
        >>> from transformers import Qwen3MoeConfig
        >>> from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter
        >>> gate = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=2))
        >>> _ = torch.nn.init.normal_(gate.weight)
        >>> x = torch.randn(5, 32)
        >>> all(torch.equal(a, b) for a, b in zip(FusedRouter(gate)(x), gate(x)))
        True
    """

    reads = ("weight", "top_k", "num_experts", "hidden_dim", "norm_topk_prob")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_router(original):
            raise ValueError(
                f"{type(original).__name__} is not a plain top-k router of {sorted(REPLACEABLE)}; leave it in place"
            )
        name = type(original).__name__
        self.weight = original.weight
        self.top_k = original.top_k
        self.num_experts = original.num_experts
        self.hidden_dim = original.hidden_dim
        self.normalize = True if name in FLOAT32_SCORES else original.norm_topk_prob
        self.scores_float32 = name in FLOAT32_SCORES
        self._fits_kernel = self.num_experts <= MAX_EXPERTS and self.top_k <= MAX_TOP_K

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, normalize={self.normalize}, "
            f"scores_float32={self.scores_float32}"
        )

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = hidden_states.reshape(-1, self.hidden_dim)  # [T, H]
        if self._kernel_takes(hidden):
            return moe_router(hidden, self.weight, self.top_k, self.normalize, self.scores_float32)
        return self.eager(hidden)

    def _kernel_takes(self, hidden: torch.Tensor) -> bool:
        grad = torch.is_grad_enabled() and (hidden.requires_grad or self.weight.requires_grad)
        return (
            self._fits_kernel
            and not grad  # the op has no backward
            and hidden.shape[0] <= MAX_ROWS
            and hidden.dtype == self.weight.dtype
            and fused_router_runs(hidden.device)
        )

    def eager(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """transformers' arithmetic on ``hidden [T, H]`` (bitwise the original module's result)."""
        logits = F.linear(hidden, self.weight)  # [T, E]
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        values, indices = torch.topk(probs, self.top_k, dim=-1)  # [T, k]
        if self.normalize:
            values /= values.sum(dim=-1, keepdim=True)
        return logits, (values if self.scores_float32 else values.to(logits.dtype)), indices
