"""The drafter interface: transformers' `CandidateGenerator` plus a hook for what verification computed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ..state import DecodeState


class Draft(NamedTuple):
    """Draft tokens of one step.

    Attributes:
        tokens: ``[B, K]`` int64 on the state's device (positions past a row's count are padding).
        counts: host list, drafts proposed per row (``<= K``; 0 for rows with nothing to propose).
        probs: ``[B, K, V]`` the drafter's sampling distributions when it sampled them, else None.
    """

    tokens: torch.Tensor
    counts: list[int]
    probs: torch.Tensor | None = None


@dataclass
class VerifyFeedback:
    """What a verify step computed, handed to the drafter.

    Attributes:
        committed_before: history length per row before the step.
        accepted: drafts per row that entered the history (after stop truncation); None for inactive rows.
        committed_after: history length per row after the step.
        layer_stats: per-layer statistics the verify pass produced (empty until sparse strategies fill it).
    """

    committed_before: list[int]
    accepted: list[int | None]
    committed_after: list[int]
    layer_stats: dict = field(default_factory=dict)


class Drafter(CandidateGenerator):
    """Base class of every strategy's drafter.

    The loop calls :meth:`prefill` once after the target's prefill, then per step :meth:`get_candidates` with the
    batch's `DecodeState` and K (never 0), then :meth:`on_verify` with the outcome. ``update_candidate_strategy``
    (transformers' hook) forwards to :meth:`on_verify` when called with a `VerifyFeedback`.
    """

    #: the verify forward needs this drafter's per-layer states (score collection) ...
    needs_verify_states: bool = False
    #: ... and those verify steps can still be captured in CUDA graphs (the collection is fused in the kernel)
    verify_graphable: bool = False

    @property
    def runners(self) -> list:
        """The drafter's own `ModelRunner` objects (a draft model's), for statistics."""
        return []

    def capture_graphs(self) -> None:  # noqa: B027 - optional hook
        """Called once after the prefill when the loop runs on CUDA graphs (inside the decoding experts setting):
        capture the drafter's own steps."""

    def attach(self, target) -> None:  # noqa: B027 - optional hook
        """Called before the prefill with the target's `ModelRunner` (self-speculative drafters draft with it)."""

    def layer_states(self, phase: str) -> list | None:
        """Per-layer state objects to hand the target's ``phase`` forward (``"prefill"`` or ``"verify"``), for
        example buffers its attention fills with scores; None when the drafter needs nothing."""
        return None

    def prefill(self, state: DecodeState) -> None:  # noqa: B027 - optional hook
        """Called once after the target's prefill."""

    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        raise NotImplementedError

    def on_verify(self, feedback: VerifyFeedback) -> None:  # noqa: B027 - optional hook
        """Called after every verify step (also after plain decode steps, with accepted counts of 0)."""

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:  # type: ignore[override]
        if isinstance(num_matches, VerifyFeedback):
            self.on_verify(num_matches)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-call resources (caches)."""
