"""Benchmark entry ``moe_router``: the Qwen3-30B-A3B router (128 experts, top-8, hidden 2048) for the token rows
of a decode step (1) and of verify steps (8, 16): ``triton+logits`` (logits in the kernel, one launch),
``triton`` (``F.linear`` then the routing kernel) and transformers' arithmetic (``eager``: ``F.linear``, softmax,
``torch.topk``, renormalization, cast)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..bench_registry import KernelCase, register_benchmark
from .kernel import launch

#: Qwen3-30B-A3B's router (`hf_sparse_verify.drivers.shapes` preset ``qwen3-30b-a3b``)
EXPERTS, TOP_K, HIDDEN = 128, 8, 2048
QUICK = (8, 2, 64)


def eager_router(hidden: torch.Tensor, weight: torch.Tensor, top_k: int):
    """The forward of transformers' ``Qwen3MoeTopKRouter`` with ``norm_topk_prob=True``."""
    logits = F.linear(hidden, weight)
    probs = F.softmax(logits, dtype=torch.float, dim=-1)
    values, indices = torch.topk(probs, top_k, dim=-1)
    values /= values.sum(dim=-1, keepdim=True)
    return logits, values.to(logits.dtype), indices


@register_benchmark("moe_router")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    experts, top_k, hidden = QUICK if quick else (EXPERTS, TOP_K, HIDDEN)
    size = torch.empty((), dtype=dtype).element_size()
    weight = torch.randn(experts, hidden, device=device, dtype=dtype) / hidden**0.5
    for tokens in (1, 8, 16):
        x = torch.randn(tokens, hidden, device=device, dtype=dtype)
        moved = (weight.numel() + x.numel() + tokens * experts) * size + tokens * top_k * (size + 8)
        params = dict(tokens=tokens, experts=experts, top_k=top_k, hidden=hidden)
        for variant, in_kernel in (("triton+logits", True), ("triton", False)):
            run = functools.partial(launch, x, weight, top_k, True, False, logits_in_kernel=in_kernel)
            yield KernelCase("moe_router", variant, params, moved, run)
        yield KernelCase(
            "moe_router", "eager", params, moved, functools.partial(eager_router, x, weight, top_k)
        )
