"""``auto``: several drafters behind one; the planner (`hf_sparse_verify.generation.policies.planner`) names the one
that drafts each step.

Members: prompt lookup always; the draft model when one is given; Vegas where the target's steps run on CUDA graphs
with the ``triton`` backend and the prompt is long enough for a selection to skip most of it. Every member keeps its
own state in the call's session (`_MemberSession`), so all their graphs are captured by the first call on a model
and shape bucket, and a later call captures nothing whatever the planner switches to. Between its drafts a member
is idle: prompt lookup reads the history when asked; the draft model rolls its cache back after every step
(`on_verify`) and catches up on what it missed when it drafts again; Vegas keeps its last selection, whose prefix
end falls behind and attends the tokens after it in full (`Drafter.idle_at_k0`).

The draft model is started lazily: its own prefill (a second prefill of the whole prompt) runs the first time the
planner picks it, and the planner picks it only where that pays (`Member.warm_share`). Its prefill seconds go to
the call's ``prefill_time_s``.
"""

from __future__ import annotations

import time

import torch

from ...registry import DRAFTERS, resolve
from ...step import Phase
from ..engine.state import DecodeState
from ..policies.planner import Member
from ..policies.utility_policy import Step
from .base import Draft, Drafter, VerifyFeedback
from .low_bit import LowBitLinear

#: shortest prompt Vegas joins ``auto`` from: below it its selection (at least ``min_tokens``, 256) holds most of
#: the prompt and its draft step costs about a whole step
VEGAS_MIN_PROMPT = 2048
#: prompt lookup's proposals scored while other drafters draft: this many tokens per row, at every step in calls of
#: fewer rows than `SHADOW_MAX_BATCH` (one device search per step, about 0.05 ms at 1 x 16K on a GPU), at every
#: `SHADOW_EVERY`-th step in larger ones: prompt lookup's draft part of a step is 0.09 ms at 16 x 16K on one H100
#: (run8 of bench_e2e, the one-launch search; 0.25 ms before it), 0.09x a plain step, so every fourth step costs
#: about 2% and the planner sees text turn copyable within a few steps (on random-token prompts the target's own
#: output turns repetitive, and prompt lookup then runs at 4x our K = 0: run9 at 16 x 16K)
SHADOW_WIDTH = 8
SHADOW_MAX_BATCH = 4
SHADOW_EVERY = 4
#: start K of each member's first trial (measured best constant K on the fixtures: prompt lookup and the draft model
#: 4, Vegas 6; benchmarks/results/e2e.json)
START_K = {"prompt_lookup": 4, "draft_model": 4, "low_bit": 4, "vegas": 6}


class _MemberSession:
    """A member's view of the call's session: its ``drafter_state`` is the member's own slot."""

    def __init__(self, session, name: str):
        self._session, self._name = session, name

    @property
    def drafter_state(self):
        return self._session.drafter_state.get(self._name)

    @drafter_state.setter
    def drafter_state(self, value) -> None:
        self._session.drafter_state[self._name] = value

    def __getattr__(self, attribute):
        return getattr(self._session, attribute)


class PortfolioDrafter(Drafter):
    """The drafters ``auto`` chooses from; `choose` names the one for the next step (None: a plain step)."""

    idle_at_k0 = True

    def __init__(self, members: dict[str, Drafter], target_model=None):
        if not members:
            raise ValueError("auto needs at least one drafter")
        self.members = dict(members)
        self.target_model = target_model  # sizes a draft model's own prefill against the target's
        self.current: str | None = None
        self.cold: set[str] = set()
        self.target = None
        self.prefill_s = 0.0
        self._widths = None

    @classmethod
    def from_config(cls, config, target, draft_model=None, *, vegas: bool = False) -> PortfolioDrafter:
        names = ["prompt_lookup"]
        if draft_model is not None or config.draft_model is not None:
            names.append("draft_model")
        elif (
            config.draft_weights is not None
        ):  # the target's low-bit copy, asked for, with a cache of its own
            names.append("low_bit")
        if vegas:
            names.append("vegas")
        members = {}
        for name in names:
            member_cls = resolve(DRAFTERS, name)
            given = draft_model if member_cls.takes_draft_model else None
            members[name] = member_cls.from_config(config, target=target, draft_model=given)
        return cls(members, target_model=target)

    def planner_members(self) -> dict[str, Member]:
        """What the planner knows of each member before it runs."""
        out = {}
        for name, member in self.members.items():
            warm = 0.0
            if member.own_model:
                # the weights its prefill multiplies with (a low-bit copy's packed layers count as whole)
                draft = sum(p.numel() for p in member.model.parameters()) + sum(
                    m.in_features * m.out_features
                    for m in member.model.modules()
                    if isinstance(m, LowBitLinear)
                )
                target = (
                    sum(p.numel() for p in self.target_model.parameters()) if self.target_model else draft
                )
                warm = draft / max(target, 1)
            out[name] = Member(
                start_k=START_K.get(name, 4),
                draft_grows_with_k=name != "prompt_lookup",
                warm_share=warm,
            )
        return out

    @property
    def low_bit_weights(self) -> str | None:
        """The copy its low-bit members hold (Vegas with ``draft_weights``, ``low_bit``; one format per call),
        whether or not the planner picked them: ``members`` of the statistics says who drafted."""
        return next(filter(None, (m.low_bit_weights for m in self.members.values())), None)

    @property
    def models(self) -> tuple:  # type: ignore[override]
        return tuple(m for member in self.members.values() for m in member.models)

    def session_key(self) -> tuple:
        return ("auto", *((name, member.session_key()) for name, member in self.members.items()))

    # ------------------------------------------------------------------------------------------------ hooks
    def attach(self, target, state: DecodeState, session) -> None:
        self.target = target
        self.prefill_s = 0.0
        self._widths = None
        if session is not None and not isinstance(session.drafter_state, dict):
            session.drafter_state = {}
        for name, member in self.members.items():
            member.attach(target, state, _MemberSession(session, name) if session is not None else None)
        self.cold = {name for name, member in self.members.items() if member.own_model}
        self.current = None
        self.state = state
        self._shadow = None  # (history lengths before the step, prompt lookup's proposals)
        self._pending: list[
            tuple[int, int, list[int]]
        ] = []  # (row, history length, proposal) awaiting tokens
        self._scored: dict = {}
        self._steps = 0

    def step_slots(self, phase: Phase) -> dict:
        if phase is Phase.PREFILL:  # every warm member's prefill slots (Vegas' first scores)
            slots = {}
            for name, member in self.members.items():
                if name not in self.cold:
                    slots.update(member.step_slots(phase))
            return slots
        if phase is Phase.VERIFY and self.current is not None:
            return self.members[self.current].step_slots(phase)
        return {}

    def capture_slot_sets(self) -> list[dict]:
        sets = [{}]
        for member in self.members.values():
            slots = member.step_slots(Phase.VERIFY)
            if slots and slots not in sets:
                sets.append(slots)
        return sets

    def prefill(self, state: DecodeState) -> None:
        for name, member in self.members.items():
            if name not in self.cold:
                member.prefill(state)

    def capture(self, widths) -> None:
        self._widths = widths
        for name, member in list(self.members.items()):
            if name not in self.cold:
                member.capture(widths)
            elif not member.kept_graphs():
                # the first call of this session starts it now (its own prefill counts as prefill), so no later
                # call captures anything when the planner first switches to it there
                self._warm(name, self.state)

    def capture_seconds(self) -> float:
        return sum(m.capture_seconds() for n, m in self.members.items() if n not in self.cold)

    def extra_prefill_seconds(self) -> float:
        return self.prefill_s

    def choose(self, name: str | None, state: DecodeState) -> None:
        """The member that drafts the next step (None: a plain step); a cold member starts here."""
        if name is not None and name not in self.members:
            raise ValueError(f"auto has no drafter {name!r}; it has {sorted(self.members)}")
        if name in self.cold:
            self._warm(name, state)
        self.current = name
        self._steps += 1
        lookup = self.members.get("prompt_lookup")
        due = state.batch_size < SHADOW_MAX_BATCH or self._steps % SHADOW_EVERY == 1
        if lookup is not None and name != "prompt_lookup" and due:
            # what prompt lookup would draft now, scored against what this step commits (`on_verify`)
            proposals = lookup.propose(state, SHADOW_WIDTH)
            if isinstance(
                proposals, tuple
            ):  # the device search: copied to the host behind the step, not waited on
                drafts, counts = proposals
                proposals = torch.cat([drafts, counts[:, None]], dim=1).to("cpu", non_blocking=True)
            self._shadow = (list(state.committed), proposals)

    def _warm(self, name: str, state: DecodeState) -> None:
        """A lazily started member's prefill (timed: it adds to the call's prefill) and graph capture."""
        member = self.members[name]
        device = state.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        member.prefill(state)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.prefill_s += time.perf_counter() - start
        self.cold.discard(name)
        if self._widths is not None:
            member.capture(self._widths)

    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        return self.members[self.current].get_candidates(state, num_tokens)

    def after_verify(self, start: torch.Tensor, accepted: torch.Tensor) -> None:
        if self.current is not None:
            self.members[self.current].after_verify(start, accepted)

    def on_verify(self, feedback: VerifyFeedback) -> None:
        for name, member in self.members.items():
            if name not in self.cold:
                member.on_verify(feedback)
        if self._shadow is not None:
            before, proposals = self._shadow
            if isinstance(
                proposals, torch.Tensor
            ):  # complete: the step's readback came after it in the stream
                proposals = [row[: row[-1]] for row in proposals.tolist()]  # drafts, then the count
            for row, accepted in enumerate(feedback.accepted):
                if accepted is not None and feedback.committed_before[row] == before[row]:
                    self._pending.append((row, before[row], proposals[row]))
            self._shadow = None
        scored = self._score_shadow(feedback) if self._pending else []
        self._scored = {"prompt_lookup": scored} if scored else {}

    def _score_shadow(self, feedback: VerifyFeedback) -> list[tuple[int, Step]]:
        """``(row, Step)`` of the proposals whose tokens are now all committed (or whose row stopped): the run each would
        have had against the row's own continuation. Scored once the continuation is known, not against the one
        step that followed: a row whose step committed few tokens would otherwise cut the run short exactly where
        text is hard (censoring that tracks the run itself), and prompt lookup would look better than it is."""
        steps, waiting = [], []
        history = self.state.host_tokens
        for row, before, proposal in self._pending:
            known = feedback.committed_after[row] - before
            stopped = not self.state.active[row]
            if known < len(proposal) and not stopped:
                waiting.append((row, before, proposal))
                continue
            continuation = history[row, before : before + min(known, len(proposal))].tolist()
            run = 0
            while run < len(continuation) and proposal[run] == continuation[run]:
                run += 1
            if run == len(continuation) and run < len(proposal):  # the row stopped first: at least this long
                steps.append((row, Step(run, run, (run,), 0.0)))
            elif run == SHADOW_WIDTH:
                steps.append(
                    (row, Step(SHADOW_WIDTH, SHADOW_WIDTH, (run,), 0.0))
                )  # as long as it was asked for
            else:  # a mismatch, or prompt lookup had no more to propose
                steps.append((row, Step(SHADOW_WIDTH, len(proposal), (run,), 0.0)))
        self._pending = waiting
        return steps

    def take_shadow(self) -> dict:
        scored, self._scored = self._scored, {}
        return scored

    def close(self) -> None:
        for member in self.members.values():
            member.close()
        self.target = None
        self.state = None
        self._shadow = None
