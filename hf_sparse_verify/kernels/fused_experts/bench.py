"""Benchmark entry ``fused_experts``: one Qwen3-30B-A3B experts layer (128 experts, top-8, hidden 2048, expert FFN
768) for the tokens of a decode step (1) and of verify steps (8, 16), uniformly random routing.

Variants: ``triton`` (this folder's op), ``batched_mm`` and ``grouped_mm`` (transformers' experts implementations
on the same weights). ``bytes_moved``: the weights of the experts the routing selects (each read once) plus the
activations in and out; `unique_expert_bytes` is the floor's numerator.
"""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .op import fused_experts

#: Qwen3-30B-A3B's experts (`hf_sparse_verify.drivers.shapes` preset ``qwen3-30b-a3b``)
EXPERTS, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
QUICK = (8, 2, 64, 32)


def experts_module(device, dtype, experts=EXPERTS, top_k=TOP_K, hidden=HIDDEN, inter=INTER, seed=0):
    """transformers' ``Qwen3MoeExperts`` with random weights (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``),
    so the baselines run transformers' own code on the same tensors."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(
        hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts, num_experts_per_tok=top_k
    )
    torch.manual_seed(seed)
    with torch.device(device):
        module = Qwen3MoeExperts(config).to(dtype)
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.02)
        module.down_proj.normal_(0, 0.02)
    return module.eval()


def route(tokens: int, experts: int, top_k: int, device, dtype, seed: int = 0):
    """Uniformly random top-k routing as a router with random logits gives it: ``index [T, k]`` (descending
    weight), ``weights [T, k]`` normalized to sum 1."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    probs = torch.randn(tokens, experts, generator=gen).softmax(-1)
    weights, index = probs.topk(top_k, dim=-1)
    return index.to(device), (weights / weights.sum(-1, keepdim=True)).to(device, dtype)


def unique_expert_bytes(module, index: torch.Tensor) -> int:
    """Weight bytes of the distinct experts in ``index``: what one step must read at least."""
    per_expert = (
        module.gate_up_proj[0].numel() + module.down_proj[0].numel()
    ) * module.gate_up_proj.element_size()
    return int(index.unique().numel()) * per_expert


def transformers_experts(name: str, module, x, index, weights):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    return ALL_EXPERTS_FUNCTIONS[name](module, x, index, weights)


@register_benchmark("fused_experts")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    experts, top_k, hidden, inter = QUICK if quick else (EXPERTS, TOP_K, HIDDEN, INTER)
    module = experts_module(device, dtype, experts, top_k, hidden, inter)
    size = torch.empty((), dtype=dtype).element_size()
    for tokens in (1, 8, 16):
        x = torch.randn(tokens, hidden, device=device, dtype=dtype)
        index, weights = route(tokens, experts, top_k, device, dtype, seed=tokens)
        moved = unique_expert_bytes(module, index) + 2 * x.numel() * size
        params = dict(tokens=tokens, experts=experts, top_k=top_k, hidden=hidden, inter=inter,
                      unique_experts=int(index.unique().numel()))  # fmt: skip
        args = (x, module.gate_up_proj, module.down_proj, index, weights)
        yield KernelCase("fused_experts", "triton", params, moved, functools.partial(fused_experts, *args))
        for name in ("batched_mm", "grouped_mm"):
            run = functools.partial(transformers_experts, name, module, x, index, weights)
            yield KernelCase("fused_experts", name, params, moved, run)
