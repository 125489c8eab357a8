"""K policies: how many draft tokens to propose at each step.

The loop asks ``policy.next_k()`` before every step (any K in ``[0, max_k]``; K = 0 is a plain decode step) and
reports each finished step with ``policy.observe(outcome)``. Step times can arrive one step late (CUDA events are
read after the next step's readback), so ``observe`` may be called for step ``i`` after ``next_k`` was asked for
step ``i + 1``; ``outcome.index`` says which step it is. Policies are plain Python over a few numbers per step.

Example:
    >>> policy = HeuristicKPolicy(start_k=4, max_k=8)
    >>> policy.next_k()
    4
    >>> policy.observe(StepOutcome(index=0, k=4, accepted=[4], time_s=None))
    >>> policy.next_k()
    6
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass
class StepOutcome:
    """What one finished step produced.

    Attributes:
        index: step number within the request (0 = first step after prefill).
        k: draft tokens proposed at that step (0 = plain decode step).
        accepted: drafts accepted per row that was active at that step (bonus token excluded).
        time_s: wall time of the step (draft + verify) in seconds, or None when unknown.
        drafted: drafts the drafter actually proposed per active row (prompt lookup may propose fewer than K, or
            none), or None when the loop does not say.
    """

    index: int
    k: int
    accepted: list[int]
    time_s: float | None = None
    extra: dict = field(default_factory=dict)
    drafted: list[int] | None = None

    @property
    def tokens_per_row(self) -> float:
        """Mean tokens emitted per active row at this step: accepted drafts + 1 bonus/correction token."""
        if not self.accepted:
            return 0.0
        return 1.0 + sum(self.accepted) / len(self.accepted)


class KPolicy(ABC):
    """Base class: ``next_k`` picks K, ``observe`` learns from finished steps."""

    #: a policy that needs step times sets this, so the loop records them (CUDA events or host timers)
    needs_timing: bool = False
    #: a policy that also names the drafter of each step (``auto``'s planner): `next_step` returns it
    plans_drafters: bool = False

    def __init__(self, start_k: int, max_k: int):
        if not 0 <= start_k <= max_k:
            raise ValueError(f"need 0 <= start_k <= max_k, got start_k={start_k}, max_k={max_k}")
        self.start_k = start_k
        self.max_k = max_k

    @property
    def k_bound(self) -> int:
        """The largest K this policy can return (the loop captures CUDA graphs for verify widths up to it + 1)."""
        return self.max_k

    @abstractmethod
    def next_k(self) -> int: ...

    def next_step(self, remaining: int) -> tuple[str | None, int]:
        """``(drafter member, K)`` of the next step; ``remaining`` is the most tokens an active row still needs.
        A K policy names no member (the call's one drafter drafts); ``auto``'s planner names one."""
        return None, self.next_k()

    def begin(self, prefill_s: float | None) -> None:  # noqa: B027 - optional hook
        """Called once after the prefill with its seconds."""

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Called while the device runs a step's verify, before the step is read back (the host waits there
        anyway): work for the next choice that need not see this step's outcome."""

    def observe(self, outcome: StepOutcome) -> None:  # noqa: B027 - optional hook
        """Learn from a finished step; the default ignores it."""

    def finish(self) -> None:  # noqa: B027 - optional hook
        """Called once after the last step's outcome was observed."""

    def late_reports(self) -> list[dict]:
        """Reports the policy hands over only after `finish` (a planner in another process), for
        `SpeculationStats.policy_states`; the loop's `state` readings are the rest."""
        return []

    def state(self) -> dict:
        """Numbers worth recording in `SpeculationStats` for this step (phase, utilities, ...)."""
        return {}

    def warm_start(  # noqa: B027 - optional hook
        self,
        k: int | None,
        switched_off_steps: int | None = None,
        set_k: int | None = None,
        baseline: tuple[float, int] | None = None,
    ) -> None:
        """Start from what served the previous request best (learning policies): its best K; when it ended with
        speculation switched off, the K = 0 steps to run before testing again; when it ended speculating, that K;
        the K = 0 step time of a request of the same shape and its age in steps. Default: ignore them."""

    def remembered_baseline(self) -> tuple[float, int] | None:
        """``(K = 0 step time, its age in steps)`` to remember for the next request of the same shape (learning
        policies); default: None."""
        return None

    def recent_best_k(self) -> int | None:
        """The K to remember for the next request (learning policies); default: nothing."""
        return None

    def speculating_k(self) -> int | None:
        """The K the request ended speculating at (learning policies; remembered for the next request); default:
        None."""
        return None

    def switched_off_steps(self) -> int | None:
        """When the request ended with speculation switched off, the K = 0 steps its next test was waiting for
        (learning policies; remembered for the next request); default: None."""
        return None


class ConstantKPolicy(KPolicy):
    """Always K = ``start_k`` (>= 1)."""

    def __init__(self, start_k: int, max_k: int):
        if start_k < 1:
            raise ValueError(f"a constant K policy needs K >= 1, got {start_k}")
        super().__init__(start_k, max_k)

    @property
    def k_bound(self) -> int:
        return self.start_k

    def next_k(self) -> int:
        return self.start_k


class PlainKPolicy(KPolicy):
    """K = 0 at every step: plain decoding through hf_sparse_verify's own loop, cache and attention (the
    project's own no-speculation baseline)."""

    def __init__(self, start_k: int = 0, max_k: int = 0):
        super().__init__(0, max(0, max_k))

    @property
    def k_bound(self) -> int:
        return 0

    def next_k(self) -> int:
        return 0


class HeuristicKPolicy(KPolicy):
    """transformers' assisted-decoding schedule: K += 2 when every active row accepted all drafts, else K -= 1
    (never below 1, never above ``max_k``). Batched: the whole batch shares K."""

    def __init__(self, start_k: int, max_k: int):
        super().__init__(max(1, start_k), max_k)
        self.k = self.start_k

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.k == 0 or not outcome.accepted:
            return
        if all(a == outcome.k for a in outcome.accepted):
            self.k = min(self.max_k, self.k + 2)
        else:
            self.k = max(1, self.k - 1)


def make_k_policy(config) -> KPolicy:
    """Build the policy named by ``config.k_policy`` from a `SpeculationConfig`."""
    from ...registry import K_POLICIES, resolve

    cls = resolve(K_POLICIES, config.k_policy)
    if hasattr(cls, "from_config"):
        return cls.from_config(config)
    return cls(config.num_draft_tokens, config.max_draft_tokens)
