"""The drafter interface: transformers' `CandidateGenerator` plus the hooks of the decoding loop.

Per call the loop calls :meth:`Drafter.attach` (the target runner and the state; persistent parts come from the
session), runs the target's prefill with :meth:`Drafter.step_slots` ``("prefill")``, then :meth:`Drafter.prefill`,
:meth:`Drafter.capture` (CUDA graphs only) and per step :meth:`Drafter.get_candidates`, the verify forward with
:meth:`Drafter.step_slots` ``("verify")``, :meth:`Drafter.after_verify` (device work, before the step's readback)
and :meth:`Drafter.on_verify` (host bookkeeping, after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from transformers.generation.candidate_generator import CandidateGenerator

from ...step import Phase
from ..engine.state import DecodeState


class Draft(NamedTuple):
    """Draft tokens of one step.

    Attributes:
        tokens: ``[B, K]`` int64 on the state's device (positions past a row's count are padding).
        counts: ``[B]`` int64 on the device, drafts proposed per row (``<= K``; 0 for rows with nothing to
            propose or inactive rows).
        probs: ``[B, K, V]`` the drafter's sampling distributions when it sampled them, else None.
        host_counts: the same counts as a host list when the drafter knows them without a synchronisation
            (the loop then trims K to the longest draft); None otherwise.
    """

    tokens: torch.Tensor
    counts: torch.Tensor
    probs: torch.Tensor | None = None
    host_counts: list[int] | None = None


@dataclass
class VerifyFeedback:
    """What a verify step computed, handed to the drafter after the readback.

    Attributes:
        committed_before: history length per row before the step.
        accepted: drafts per row that entered the history (after stop truncation); None for inactive rows.
        committed_after: history length per row after the step.
    """

    committed_before: list[int]
    accepted: list[int | None]
    committed_after: list[int]


class Drafter(CandidateGenerator):
    """Base class of every strategy's drafter."""

    #: the drafter's own models (moved to the decoding experts setting, switched to our attention)
    models: tuple = ()
    #: plain steps (K = 0) skip this drafter's verify slots and `after_verify`: its state stays valid without them
    #: (a self-speculative selection whose prefix end falls behind attends the tokens after it in full), so a K
    #: policy that switches speculation off pays what our K = 0 path pays
    idle_at_k0: bool = False
    #: drafts with a second model (``draft_model=`` / transformers' ``assistant_model=``); other drafters refuse one
    takes_draft_model: ClassVar[bool] = False
    #: drafts with a model of its own that keeps its own KV cache and needs its own prefill (a draft model, the
    #: target's low-bit copy): ``auto`` starts it cold, on the first step it is chosen for
    own_model: ClassVar[bool] = False
    #: draft steps read a selection of the target's own cache (self-speculation): the attention backends that gather
    #: a selection (``triton`` / ``token_sparse``) serve them, also where steps run eagerly
    reads_target_cache: ClassVar[bool] = False
    #: ranks cached tokens by the verify pass's attention over the whole cache, which lossy sparse verify attention
    #: skips: the two cannot be combined
    needs_dense_verify_attention: ClassVar[bool] = False
    #: has a KV-selection ``ratio`` that ``hf-sparse-verify tune`` searches (with K)
    tunes_ratio: ClassVar[bool] = False
    #: its draft is always a low-bit copy of the target (strategy ``low_bit``): ``draft_weights="auto"`` never means
    #: the model's own weights for it
    drafts_on_a_copy: ClassVar[bool] = False

    @property
    def low_bit_weights(self) -> str | None:
        """The format of the target's low-bit copy this drafter drafts with once attached (``"int4"`` / ``"int8"``),
        or None: `SpeculationStats.draft_weights`."""
        return None

    def session_key(self) -> tuple:
        """What decides the graphs and buffers this drafter keeps in a session (with the target's key)."""
        return (type(self).__name__,)

    def attach(self, target, state: DecodeState, session) -> None:  # noqa: B027 - optional hook
        """Before the prefill: the target's `ModelRunner`, the call's state, and the `Session` (None without
        CUDA graphs) where persistent parts live in ``session.drafter_state``."""

    def step_slots(self, phase: Phase) -> dict:
        """Step slots (`StepContext` fields) the target's ``phase`` forward gets from this drafter (prefill or
        verify), for example a `ScoreCollection`."""
        return {}

    def prefill(self, state: DecodeState) -> None:  # noqa: B027 - optional hook
        """Called once after the target's prefill and the first token."""

    def extra_prefill_seconds(self) -> float:
        """Seconds of prefill work this call did outside the loop's prefill (a lazily started draft model)."""
        return 0.0

    def choose(self, name: str | None, state: DecodeState) -> None:
        """Which of this drafter's members drafts the next step (``auto``'s planner names one; None for a plain
        step). A single drafter has no members and accepts only None."""
        if name is not None:
            raise ValueError(f"{type(self).__name__} has no member {name!r} to choose")

    def take_shadow(self) -> dict:
        """Evidence of drafters that did not draft this step, scored against the committed tokens (``auto``'s
        prompt lookup): member name -> list of (row, `Step`) for the planner; read once per step after `on_verify`."""
        return {}

    def capture_slot_sets(self) -> list[dict]:
        """Every set of verify step slots this drafter's steps use (the loop captures each verify width with
        each)."""
        return [self.step_slots(Phase.VERIFY)]

    def capture(self, widths) -> None:  # noqa: B027 - optional hook
        """Called once per call when the loop runs on CUDA graphs (inside the decoding experts setting), after
        the target's verify widths are captured: capture the drafter's own steps (kept captures are reused)."""

    def capture_seconds(self) -> float:
        """Seconds this call spent capturing the drafter's graphs."""
        return 0.0

    def kept_graphs(self) -> bool:
        """Whether the call's session already holds this drafter's captured steps (`PortfolioDrafter` starts a
        lazily started member in the first call of a session, so no later call captures)."""
        return True

    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        raise NotImplementedError

    def after_verify(self, start: torch.Tensor, accepted: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Device work after the verify forward, before the step's readback: ``start`` ``[B]`` the verify step's
        first slot per row, ``accepted`` ``[B]`` accepted drafts (before stopping). No host values."""

    def on_verify(self, feedback: VerifyFeedback) -> None:  # noqa: B027 - optional hook
        """Host bookkeeping after every step's readback (also after plain decode steps)."""

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:  # type: ignore[override]
        if isinstance(num_matches, VerifyFeedback):
            self.on_verify(num_matches)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-call references."""


def empty_draft(batch: int, device: torch.device) -> Draft:
    zeros = torch.zeros(batch, dtype=torch.long, device=device)
    return Draft(torch.zeros(batch, 0, dtype=torch.long, device=device), zeros, None, [0] * batch)
