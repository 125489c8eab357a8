"""Benchmark entry ``topk_slots``: Vegas' selection update on the 8B shape (32 layers), 7% of the prefix kept with
a recent window of 30% of it, max-pooling over 7 slots. Variants: ``triton`` (this folder's kernel), ``torch_topk``
(the engine's path before the kernel: pooling and masking passes, ``torch.topk``, a sort of the picks) and ``torch``
(the reference: the same with a stable sort for the ties)."""

from __future__ import annotations

import math

import torch

from ..bench_registry import KernelCase, register_benchmark
from .kernel import topk_slots_triton
from .naive import pool_scores, prefix_valid, topk_slots_naive

LAYERS, RATIO, RECENT_SHARE, POOL = 32, 0.07, 0.3, 7


def _inputs(device, batch, context, layers, seed=0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    count = math.ceil(RATIO * context)
    return dict(
        scores=torch.rand(layers, batch, context, generator=gen).to(device),
        pad=torch.zeros(batch, dtype=torch.long, device=device),
        recent_start=torch.full((batch,), context, dtype=torch.long, device=device),
        count=torch.full((batch,), count, dtype=torch.long, device=device),
        k_slots=count,
        recent=torch.full((batch,), round(count * RECENT_SHARE), dtype=torch.long, device=device),
        pool=POOL,
    )


def torch_topk(scores, pad, recent_start, count, k_slots, recent, pool):
    """The selection as plain PyTorch ops with ``torch.topk`` (ties in no defined order)."""
    length = scores.shape[-1]
    valid = prefix_valid(pad, recent_start, length)
    fill = torch.full((1, length), float("-inf"), device=scores.device)
    ranked = pool_scores(torch.where(valid, scores, fill), pool)
    window = valid & (torch.arange(length, device=scores.device)[None, :] >= (recent_start - recent)[:, None])
    ranked = torch.where(valid & ~window, ranked, torch.where(window, float("inf"), fill))
    top = ranked.topk(k_slots, dim=-1).indices
    keep = torch.arange(k_slots, device=scores.device)[None, :] < count[:, None]
    ordered = torch.where(keep, top, length).sort(dim=-1).values
    return torch.where(ordered < length, ordered, 0)


@register_benchmark("topk_slots")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    layers = 2 if quick else LAYERS
    shapes = ((1, 1024),) if quick else ((16, 16384), (4, 65536), (1, 65536))
    for batch, context in shapes:
        a = _inputs(device, batch, context, layers)
        # the scores read once, the selection written once
        bytes_moved = layers * batch * (context * 4 + a["k_slots"] * 8)
        params = dict(layers=layers, batch=batch, context=context, k_slots=a["k_slots"], pool=POOL)
        yield KernelCase("topk_slots", "triton", params, bytes_moved, lambda a=a: topk_slots_triton(**a))
        yield KernelCase("topk_slots", "torch_topk", params, bytes_moved, lambda a=a: torch_topk(**a))
        yield KernelCase("topk_slots", "torch", params, bytes_moved, lambda a=a: topk_slots_naive(**a))
