"""Experts implementation for decoding steps, through transformers' public experts API.

transformers' own decoding loop (`GenerationMixin._sample`) switches MoE models from the ``grouped_mm`` experts
implementation to ``batched_mm`` after the prefill on non-CPU devices, because ``batched_mm`` is much faster on
the few tokens of a decode step. hf_sparse_verify runs its own loop, so it makes the same switch for its draft,
verify and decode steps (a verify step has at most ``max_draft_tokens + 1`` tokens per row). Measured on an H200
before this switch (code-moe, bf16, batch 1): our K = 0 path ran at 0.76x plain ``generate``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _implementations(model) -> dict | None:
    getter = getattr(model, "get_experts_implementation", None)
    if getter is None:
        return None
    try:
        return getter()
    except (AttributeError, ValueError):
        return None


@contextlib.contextmanager
def experts_for_decoding(*models: torch.nn.Module) -> Iterator[None]:
    """Within the block, every ``grouped_mm`` experts implementation of ``models`` (on non-CPU devices) is
    ``batched_mm``; the original implementations are restored on exit."""
    switched = []
    try:
        for model in models:
            original = _implementations(model)
            on_cpu = next(model.parameters()).device.type == "cpu"
            if not original or on_cpu or "grouped_mm" not in original.values():
                continue
            model.set_experts_implementation(
                {k: "batched_mm" if v == "grouped_mm" else v for k, v in original.items()}
            )
            switched.append((model, original))
        yield
    finally:
        for model, original in reversed(switched):
            model.set_experts_implementation(original)
