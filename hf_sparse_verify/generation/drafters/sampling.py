"""How drafters turn their logits into draft tokens (shared by every drafter that has logits)."""

from __future__ import annotations

import torch

from ..engine.state import DecodeState
from ..verification.processing import history_free_part


def pick_tokens(logits: torch.Tensor, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Greedy: argmax of ``logits`` ``[B, V]``, no probabilities. Sampling: a sample from the softmax of the logits
    after the call's history-free processors (temperature, top-k, top-p, ...), and that distribution ``[B, V]``,
    which speculative sampling needs as ``q``."""
    if not state.do_sample:
        return logits.argmax(-1), None
    warpers = history_free_part(state.processors)
    scores = warpers(state.tokens[:, :1], logits) if len(warpers) else logits
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1).squeeze(1), probs
