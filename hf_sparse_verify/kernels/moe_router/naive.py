"""Reference MoE router: the arithmetic of transformers' ``Qwen3MoeTopKRouter`` / ``Qwen2MoeTopKRouter`` /
``OlmoeTopKRouter`` / ``MixtralTopKRouter`` forwards, with one defined order among exactly equal probabilities
(the lower expert index first; ``torch.topk`` leaves that order unspecified)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route_from_logits(
    logits: torch.Tensor, top_k: int, normalize: bool, scores_float32: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores ``[T, k]`` and expert ids ``[T, k]`` int64 of router logits ``[T, E]``: float32 softmax, the ``k``
    largest probabilities in descending order (ties: lower expert id first), divided by their float32 sum when
    ``normalize``, cast to ``logits.dtype`` unless ``scores_float32``."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
    values, indices = torch.sort(probs, dim=-1, descending=True, stable=True)
    values, indices = values[:, :top_k], indices[:, :top_k]
    if normalize:
        values = values / values.sum(dim=-1, keepdim=True)
    return (values if scores_float32 else values.to(logits.dtype)), indices


def moe_router_naive(
    hidden: torch.Tensor, weight: torch.Tensor, top_k: int, normalize: bool, scores_float32: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [T, E], scores [T, k], indices [T, k])`` of ``hidden [T, H]`` and the router ``weight [E, H]``:
    ``logits = F.linear(hidden, weight)`` in ``hidden.dtype``, then `route_from_logits`."""
    logits = F.linear(hidden, weight)  # [T, E]
    return (logits, *route_from_logits(logits, top_k, normalize, scores_float32))
