"""Benchmark entry ``expert_skip``: the bookkeeping of expert skipping for 1, 8 and 16 tokens of top-8 routing
(Qwen3-30B-A3B), ``triton`` (this folder's op) vs ``torch`` (`order_by_weight` + `skip_counts`, eager), budget
rule. ``bytes_moved``: ids and weights in and out plus the counts."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import SkipRule, expert_skip_naive
from .op import expert_skip


@register_benchmark("expert_skip")
def expert_skip_cases(device: torch.device, dtype: torch.dtype, quick: bool):
    skip = SkipRule("budget", 4, torch.tensor(0.5, device=device))
    for tokens in (1, 8, 16):
        weights = torch.softmax(torch.randn(tokens, 8, device=device), dim=-1).to(dtype)
        index = torch.randint(0, 128, (tokens, 8), device=device)
        moved = tokens * 8 * 2 * (index.element_size() + weights.element_size()) + tokens * 4
        params = dict(tokens=tokens, top_k=8)
        yield KernelCase(
            "expert_skip", "triton", params, moved, functools.partial(expert_skip, index, weights, skip)
        )
        yield KernelCase(
            "expert_skip", "torch", params, moved, functools.partial(expert_skip_naive, index, weights, skip)
        )
