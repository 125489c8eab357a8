"""Cascade's utility-driven K policy: test-and-set, switch-off, adaptive back-off and hill climbing.

The *utility* of a draft length K (Cascade, Sec. 4) is the speedup it buys over plain decoding::

    utility(K) = ETR(K) / (step_time(K) / step_time(0))

ETR is the effective number of tokens a step emits (accepted drafts + 1; a K = 0 step yields 1) and
``step_time(0)`` the time of a plain decode step. Time per output token at K is the plain one divided by
``utility(K)`` (the paper's Theorem 4.2): above 1 speculation pays, below 1 it slows decoding down.

The policy runs one state machine per request (or per batch, see below)::

    baseline (B steps at K = 0) -> test (up to M trials of t steps) -> set (S steps) -> test -> set -> ...

- **baseline**: the first ``baseline_steps`` (B = 4) steps are plain decode steps that measure ``step_time(0)``:
  the median of the last B timed K = 0 steps (every K = 0 step counts, so a set phase at K = 0 keeps it fresh).
  When no K = 0 step ran for ``baseline_refresh`` (100) steps, B plain steps are scheduled again: before the
  next test phase, or in the middle of a set phase (which then resumes). Ours: ``step_time(0)`` only decides
  whether to speculate, so the period is stretched by ``(u - 1) / tolerance`` (at least 1), ``u`` the best
  utility measured last: at utility 3 a refresh comes every 2000 steps, near 1 every 100.
- **test**: trials of ``trial_steps`` (t = 4) steps at one K each. The first trial runs the non-zero K with
  the best utility in the last test and set phase (``k_start`` = 3 at first); after a set phase at K = 0 it runs
  K = 1, the cheapest speculative step (Sec. 5.4). :func:`plan_next_trial` picks each next K by hill climbing
  and ends the phase early (switch-off at K = 1, falling utility, converged utility, ...).
- **set**: ``set_steps`` (S = 16) steps at the best K of the test phase when its utility is >= 1, else at K = 0
  (speculation switched off). Entering the set phase at K = 0 doubles S (adaptive back-off, so testing gets
  exponentially rarer while speculation keeps failing); entering it at K > 0 resets S to ``set_steps``.

Pooled estimates (ours). The paper's trial utility is ``sum(ETR) * step_time(0) / sum(step time)`` over the trial's
own t steps, so two Ks are compared on different text; drafts come in bursts, and on the H200 Cascade run
(`benchmarks/bench_cascade.py --suite e2e`, replayed by `benchmarks/replay_cascade.py`) that noise walked K away
from the best static K. Every timed speculative step is kept as a `Step` (K issued, K run, drafts accepted per row,
time), and :func:`pooled_utilities` estimates the utility of any K from steps run at any K: expected tokens from a
censored run-length model (:func:`run_length_survival`: drafts accepted at K count at every smaller K, a row that
accepted all K drafts is censored there) and the expected step time from per-K medians of this request's steps
(:func:`step_costs`) at the K each step would have run with. Where a K is not estimable, its trial's own utility
is used.

- test: each trial's utility is pooled over all trials of the phase (the same text for every K), re-scored after
  every trial; the set phase may also pick the last set phase's K. Speculation is switched off only when no
  trial's own utility is >= 1 either: pooled over the phase, older trials outvote the last one when the text has
  just turned good, and staying off then costs the most;
- end of a set phase at K > 0: when its steps (with the last test's) estimate every K up to it and K + 1 could not
  pay more (:meth:`UtilityKPolicy._room_above`: even if every row cut by K accepted one more draft), the next set
  phase runs at the best of them without a test (exit ``"confident"``); it stays at K unless another K beats it by
  more than ``tolerance``;
- every 2 steps of a set phase at K < ``max_k``: when the last 2 steps that drafted accepted all K drafts in every
  row and K + 1 could pay more, the set phase ends there and is the first trial of a test phase (the saturation
  jump of :func:`plan_next_trial` follows). Drafts come in bursts: on the replay a check every t = 4 steps on 4
  steps left bursts at a small K for up to 7 steps (code-moe mix: 0.982 -> 0.985 of the best static K);
- the evidence is the steps issued in the last ``set_steps + max_trials * t`` steps (a test and a set phase),
  since speculation was last switched on; step costs are kept for the whole request (they depend on the model
  and machine, not on the text).

Timing: ``needs_timing = True`` asks the loop for step times. Outcomes are matched to steps by ``index`` and may
arrive late; a step whose time is None (or not a positive finite number) contributes nothing. Decisions use the
outcomes that have arrived: a trial with no timed step after its t steps is extended one step at a time (at most
t more); a trial without a measurable utility ends the test phase and the set phase keeps its K.

Between requests (`warm_start`): a request that ends in a test phase whose best K so far pays is handed on as
speculating at that K, not as switched off (its last set phase may have been at K = 0).

Batches: the whole batch shares K. ETR is 1 + the mean of the accepted drafts over the active rows and the step
time is the batch's, so utility is the batch's throughput relative to plain decoding of the batch (at batch 1 this
is the paper's per-request decision). The decisions (:func:`plan_next_trial`, :func:`choose_set_k`) only see
``(K, utility)`` pairs, so a per-row policy can reuse them.

Example (drafts are right up to 2 tokens, each draft token costs 20% of a plain step; K = 2 is best):
    >>> from hf_sparse_verify.generation.policies.k_policy import StepOutcome
    >>> policy = UtilityKPolicy(max_k=8)  # k_start=3, t=4, M=4, S=16, B=4
    >>> ks = []
    >>> for i in range(36):
    ...     k = policy.next_k()
    ...     ks.append(k)
    ...     policy.observe(StepOutcome(index=i, k=k, accepted=[min(k, 2)], time_s=1.0 + 0.2 * k))
    >>> ks[:4], ks[4:20:4], ks[20:36]  # baseline, one K per trial (3 -> 4 fell, back to 2 -> 1 fell), set phase
    ([0, 0, 0, 0], [3, 4, 2, 1], [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2])
    >>> state = policy.state()
    >>> state["phase"], state["k"], state["best_k"], state["set_steps"], state["exit"]
    ('set', 2, 2, 16, 'max_trials')
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from statistics import median
from typing import NamedTuple

from .k_policy import KPolicy, StepOutcome

BASELINE, TEST, SET = "baseline", "test", "set"

#: a K's step cost is its own median from this many steps on (a median of 3 ignores one outlier), else interpolated
_MIN_COST_STEPS = 3
#: a set phase whose last this many drafting steps accepted every draft is cut by K (`UtilityKPolicy._cut_by_k`)
_CUT_STEPS = 2
#: outcomes of at most this many issued steps are awaited; older ones are forgotten (a loop that never reports)
_MAX_PENDING = 1024


class Step(NamedTuple):
    """One timed speculative step: the K issued, the K it ran with (the loop trims K to the longest draft, so
    ``k < issued`` says the drafter had no more to propose), the drafts accepted per active row, its time."""

    issued: int
    k: int
    accepted: tuple[int, ...]
    time_s: float


class Window:
    """The timed steps run at one K: one trial, or one set phase."""

    def __init__(self, k: int):
        self.k = k
        self.tokens = 0.0  # sum of ETR
        self.time_s = 0.0  # sum of step times
        self.timed = 0  # steps with a known time
        self.drafted = 0  # drafts proposed in the timed steps (when the loop reports them)
        self.accepted = 0  # of which accepted
        self.steps: list[Step] = []
        self.issued = 0  # steps issued at this K (timed or not)

    def add(
        self,
        etr: float,
        time_s: float,
        accepted: list[int] | None = None,
        drafted: list[int] | None = None,
        ran_k: int | None = None,
    ):
        self.tokens += etr
        self.time_s += time_s
        self.timed += 1
        if accepted is not None and drafted is not None:
            self.drafted += sum(drafted)
            self.accepted += sum(accepted)
        if accepted:
            k = self.k if ran_k is None else max(0, min(int(ran_k), self.k))
            self.steps.append(Step(self.k, k, tuple(min(int(a), k) for a in accepted), time_s))

    @property
    def saturated(self) -> bool:
        """Every draft proposed in the window's timed steps was accepted (and some were proposed): the drafts were
        cut by K, not by the drafter's mistakes, so a larger K likely pays more."""
        return self.drafted > 0 and self.accepted >= self.drafted

    def utility(self, baseline_s: float | None) -> float | None:
        """``mean ETR / (mean step time / baseline_s)``; None without a timed step or a baseline."""
        if self.timed == 0 or baseline_s is None:
            return None
        return self.tokens * baseline_s / self.time_s


def plan_next_trial(
    trials: list[tuple[int, float]], max_k: int, max_trials: int, tolerance: float, saturated: bool = False
) -> tuple[int | None, str]:
    """Hill-climbing step of a test phase: the K of the next trial, or None and why the phase ends.

    Args:
        trials: ``(K, utility)`` of the trials of this test phase so far, oldest first (distinct K >= 1).
        max_k: largest K to try.
        max_trials: M, trials per test phase.
        tolerance: relative difference under which two successive utilities count as equal.
        saturated: the last trial's drafts were all accepted (see `Window.saturated`).

    Returns ``(next_k, "climb")`` or ``(None, reason)``, checked in this order:
    ``"k_zero"`` (K = 1 has utility < 1: switch-off); a utility < 1 at K > 1 moves to the lowest K tried - 1
    (toward K = 0) before any early exit, while trials remain; then ``"k_max"`` (saturated at ``max_k``, see below),
    ``"falling"`` (utility fell in two successive trials),
    ``"converged"`` (the last two utilities are within ``tolerance``), ``"max_trials"``, then, from the next K:
    ``"k_zero"`` (it would be 0), ``"k_max"`` (above ``max_k``) or ``"peak"`` (already tried: the maximum is
    bracketed). The next K is the lowest K tried - 1 when the last utility is < 1 (move toward K = 0); after the
    first trial K + 1 (K - 1 at ``max_k``); otherwise one more step the same way when utility rose from the
    previous trial, or one step past the previous K the other way when it fell.

    Saturation jump (ours, not in the paper): when the last trial was ``saturated``, its utility is >= 1 and it
    rose going up (or it is the first trial), the phase ends at ``max_k`` (``"k_max"``: every smaller K would emit
    less on the same steps), else the next K is ``min(2 K, max_k)`` and the converged exit is skipped:
    every draft being accepted says K, not the drafter, limited the step. A fall after such a jump tries the
    middle of the bracket. On the H200 Cascade run (`benchmarks/bench_cascade.py --suite e2e`) the climb one K at
    a time from K = 3 used most of each 128-token request, while the best static K was the largest tried.

    Example:
        >>> plan_next_trial([(3, 1.4)], max_k=8, max_trials=4, tolerance=0.1)
        (4, 'climb')
        >>> plan_next_trial([(3, 1.4), (4, 1.1)], max_k=8, max_trials=4, tolerance=0.1)  # fell going up
        (2, 'climb')
        >>> plan_next_trial([(3, 0.6), (2, 0.7), (1, 0.8)], max_k=8, max_trials=4, tolerance=0.1)
        (None, 'k_zero')
        >>> plan_next_trial([(3, 1.4)], max_k=8, max_trials=4, tolerance=0.1, saturated=True)  # jump
        (6, 'climb')
        >>> plan_next_trial([(3, 1.4), (6, 1.1)], max_k=8, max_trials=4, tolerance=0.1)  # fell: the middle
        (4, 'climb')
    """
    k, u = trials[-1]
    if u < 1.0 and k == 1:
        return None, "k_zero"
    tried = {trial_k for trial_k, _ in trials}
    if u < 1.0 and len(trials) < max_trials:
        # switch-off: below 1 keep moving toward K = 0 until K = 1 has been tried (no early exit before that)
        next_k = min(tried) - 1
        return (next_k, "climb") if next_k >= 1 else (None, "k_zero")
    climbing = len(trials) == 1 or (u > trials[-2][1] and k > trials[-2][0])
    if saturated and climbing and u >= 1.0 and k == max_k:
        # every draft accepted at the largest K: nothing above it, and a smaller K emits less
        return None, "k_max"
    jump = saturated and climbing and u >= 1.0 and k < max_k
    if len(trials) >= 3 and u < trials[-2][1] < trials[-3][1]:
        return None, "falling"
    if not jump and len(trials) >= 2 and abs(u - trials[-2][1]) <= tolerance * trials[-2][1]:
        return None, "converged"
    if len(trials) >= max_trials:
        return None, "max_trials"
    if u < 1.0:
        next_k = min(tried) - 1
    elif jump:
        next_k = min(2 * k, max_k)
    elif len(trials) == 1:
        next_k = k + 1 if k < max_k else k - 1
    else:
        prev_k, prev_u = trials[-2]
        step = 1 if k > prev_k else -1
        if u > prev_u:
            next_k = k + step
        elif abs(k - prev_k) > 1:  # fell after a jump: the middle of the bracket
            next_k = (k + prev_k) // 2
        else:
            next_k = prev_k - step
    if next_k <= 0:
        return None, "k_zero"
    if next_k > max_k:
        return None, "k_max"
    if next_k in tried:
        return None, "peak"
    return next_k, "climb"


def choose_set_k(trials: list[tuple[int, float]]) -> tuple[int, int | None]:
    """``(K for the set phase, best K)``: the best K when its utility is >= 1, else 0 (ties go to the smaller K).

    Example:
        >>> choose_set_k([(3, 1.2), (4, 1.5)]), choose_set_k([(3, 0.6), (2, 0.7)]), choose_set_k([])
        ((4, 4), (0, 2), (0, None))
    """
    if not trials:
        return 0, None
    best_k, best_u = max(trials, key=lambda trial: (trial[1], -trial[0]))
    return (best_k if best_u >= 1.0 else 0), best_k


def run_length_survival(steps: list[Step], max_k: int) -> list[float | None]:
    """Kaplan-Meier estimate of ``P(run >= j)`` for ``j = 0 .. max_k`` over the rows of ``steps``.

    A row's *run* is how many drafts it would accept with no limit on K. A row that accepted fewer drafts than the
    K issued shows its run (a rejection, or the drafter had no more: the loop ran a smaller K); a row that accepted
    all K issued is censored there (its run is at least K). Drafts accepted at K count as accepted at any smaller
    K (a shorter draft is a prefix of the longer one). So every step tells about every K, and a K is judged on the
    same text as the others, not on its own few steps. None from the first ``j`` no row reached uncensored.

    Example (runs: at least 4, exactly 1, at least 2):
        >>> steps = [Step(4, 4, (4,), 1.0), Step(4, 4, (1,), 1.0), Step(2, 2, (2,), 1.0)]
        >>> [None if s is None else round(s, 3) for s in run_length_survival(steps, 5)]
        [1.0, 1.0, 0.667, 0.667, 0.667, None]
    """
    reached = [0] * (max_k + 2)  # rows that accepted exactly a drafts (a capped at max_k)
    stopped = [0] * (max_k + 2)  # rows whose run is exactly j - 1
    for step in steps:
        for accepted in step.accepted:
            reached[min(accepted, max_k)] += 1
            if accepted < step.issued and accepted < max_k:
                stopped[accepted + 1] += 1
    survived = [0] * (max_k + 2)  # rows known to go from run >= j - 1 to run >= j: accepted >= j
    for j in range(max_k, 0, -1):
        survived[j] = survived[j + 1] + reached[j]
    survival: list[float | None] = [1.0]
    for j in range(1, max_k + 1):
        at_risk = survived[j] + stopped[j]
        previous = survival[-1]
        if previous is None or previous == 0.0:
            survival.append(previous)  # unknown stays unknown; no run reaches past where all stopped
        else:
            survival.append(None if at_risk == 0 else previous * survived[j] / at_risk)
    return survival


def step_costs(times: dict[int, Sequence[float]], max_k: int) -> list[float | None]:
    """Step cost by the K a step ran with (``0 .. max_k``) from ``times`` (K -> step times): the median at the
    Ks seen in at least `_MIN_COST_STEPS` steps and at the smallest and largest K seen, linearly interpolated
    between them, None outside them (no extrapolation). Medians, and few-step Ks only at the ends, because one
    step in tens takes several times as long (host or device hiccups).

    Example:
        >>> step_costs({0: [1.0, 1.0, 1.0], 4: [2.0, 3.0, 9.0]}, 6)
        [1.0, 1.5, 2.0, 2.5, 3.0, None, None]
    """
    costs: list[float | None] = [None] * (max_k + 1)
    times = {k: t for k, t in times.items() if t and 0 <= k <= max_k}
    if not times:
        return costs
    ends = {min(times), max(times)}
    seen = sorted(k for k in times if len(times[k]) >= _MIN_COST_STEPS or k in ends)
    for low, high in zip(seen, seen[1:] + seen[-1:]):
        low_s, high_s = median(times[low]), median(times[high])
        for k in range(low, high + 1):
            costs[k] = low_s if high == low else low_s + (high_s - low_s) * (k - low) / (high - low)
    return costs


def pooled_utilities(
    steps: list[Step],
    ks,
    max_k: int,
    baseline_s: float | None,
    costs: list[float | None],
    optimistic: bool = False,
) -> dict[int, float | None]:
    """Utility of each K in ``ks`` from all ``steps`` (run at any K): expected tokens from `run_length_survival`,
    expected step time from ``costs`` (`step_costs`) at the K each step would have run with (what its drafter had,
    up to K). None where either is unknown, or without steps or a baseline. ``optimistic``: where the survival is
    unknown (every row that got there was cut by K), take it as flat (those rows would have accepted every draft):
    an upper bound.

    Example (drafts right up to 2 tokens; a step costs 1 + 0.2 K; steps at K = 3 and 4 tell about K = 1 .. 4):
        >>> steps = [Step(k, k, (2,), 1.0 + 0.2 * k) for k in (3, 3, 4, 4)]
        >>> costs = [1.0 + 0.2 * k for k in range(9)]
        >>> {k: round(u, 3) for k, u in pooled_utilities(steps, [1, 2, 3, 4], 8, 1.0, costs).items()}
        {1: 1.667, 2: 2.143, 3: 1.875, 4: 1.667}
    """
    if not steps or baseline_s is None:
        return dict.fromkeys(ks)
    survival = run_length_survival(steps, max_k)
    if optimistic:
        for j in range(1, max_k + 1):
            if survival[j] is None:
                survival[j] = survival[j - 1]
    short: dict[int, int] = {}  # steps whose drafter had fewer drafts than the K issued, by the K they ran
    for step in steps:
        if step.k < step.issued:
            short[step.k] = short.get(step.k, 0) + 1
    full = len(steps) - sum(short.values())  # steps that ran the K issued: at a smaller K they run that K
    out: dict[int, float | None] = {}
    for k in ks:
        ran = {k: full} if full else {}  # the K each step would have run with -> steps
        for r, count in short.items():
            ran[min(r, k)] = ran.get(min(r, k), 0) + count
        if any(survival[j] is None for j in range(1, k + 1)) or any(costs[r] is None for r in ran):
            out[k] = None
            continue
        tokens = 1.0 + sum(survival[j] for j in range(1, k + 1))  # type: ignore[misc]
        seconds = sum(costs[r] * count for r, count in ran.items())  # type: ignore[operator]
        out[k] = tokens * baseline_s * len(steps) / seconds
    return out


def _usable(baseline) -> bool:
    try:
        baseline_s, age = baseline
        return math.isfinite(float(baseline_s)) and float(baseline_s) > 0 and int(age) >= 0
    except (TypeError, ValueError):
        return False


class UtilityKPolicy(KPolicy):
    """Cascade's test-and-set K policy (see the module docstring for the state machine).

    Args:
        max_k: largest K (``SpeculationConfig.max_draft_tokens``).
        k_start: K of the first trial (paper: 3).
        trial_steps: t, steps per trial (4).
        max_trials: M, trials per test phase (4).
        set_steps: S, steps of a set phase before back-off (16).
        baseline_steps: plain decode steps that measure the K = 0 step time at the start (4).
        baseline_refresh: steps without a K = 0 step after which the measurement is refreshed (100).
        tolerance: successive trial utilities within this relative difference end the test phase (0.10).
    """

    needs_timing = True

    def __init__(
        self,
        max_k: int,
        k_start: int = 3,
        trial_steps: int = 4,
        max_trials: int = 4,
        set_steps: int = 16,
        baseline_steps: int = 4,
        baseline_refresh: int = 100,
        tolerance: float = 0.10,
    ):
        if k_start < 1:
            raise ValueError(f"k_start must be >= 1 (the first trial speculates), got {k_start}")
        super().__init__(k_start, max_k)
        for name, value in (
            ("trial_steps", trial_steps),
            ("max_trials", max_trials),
            ("set_steps", set_steps),
            ("baseline_steps", baseline_steps),
            ("baseline_refresh", baseline_refresh),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        self.trial_steps = trial_steps
        self.max_trials = max_trials
        self.set_steps = set_steps
        self.baseline_steps = baseline_steps
        self.baseline_refresh = baseline_refresh
        self.tolerance = tolerance
        self.reset()

    @classmethod
    def from_config(cls, config) -> UtilityKPolicy:
        """Build from a `SpeculationConfig` (``max_draft_tokens`` and the ``utility_*`` fields)."""
        return cls(
            max_k=config.max_draft_tokens,
            k_start=config.utility_k_start,
            trial_steps=config.utility_trial_steps,
            max_trials=config.utility_max_trials,
            set_steps=config.utility_set_steps,
            baseline_steps=config.utility_baseline_steps,
            baseline_refresh=config.utility_baseline_refresh,
            tolerance=config.utility_tolerance,
        )

    def reset(self) -> None:
        """Forget everything: the next step is the first step of a new request."""
        self._step = 0  # index of the next step to issue
        self._pending: dict[int, Window] = {}  # issued step -> window its outcome feeds
        self._plain_times: deque[float] = deque(maxlen=self.baseline_steps)
        self._last_plain_step = 0
        self._set_len = self.set_steps
        self._off = False  # the last set phase entered runs at K = 0 (speculation switched off)
        self._trials: list[tuple[Window, float | None]] = []  # this (or the last) test phase
        self._recent: deque[tuple[int, Step]] = deque()  # (step index, step), see `_evidence`
        self._recent_span = self.set_steps + self.max_trials * self.trial_steps
        self._times: dict[int, deque[float]] = {}  # K a step ran with -> its last set_steps step times
        self._last_set: Window | None = None
        self._paused: tuple[str, Window, int] | None = None  # set phase interrupted by a baseline refresh
        self._margin: float | None = None  # best utility of the last decision (see `_refresh_due`)
        self._seed: Window | None = None  # a set phase cut by K: the first trial of the next test phase
        self._last_utility: float | None = None
        self._best_k: int | None = None
        self._exit: str | None = None
        self._issued = (BASELINE, 0)
        self._warm_off: int | None = None  # `warm_start`: K = 0 steps before the first test
        self._baseline_ran = False
        self._begin(BASELINE, Window(0), self.baseline_steps)

    # ------------------------------------------------------------------------------------------- loop interface
    def next_k(self) -> int:
        if self._cut_by_k():
            self._left, self._seed = 0, self._window
        while self._left == 0:
            self._end_segment()
        if self._phase == SET and self._margin is not None and self._refresh_due():
            self._paused = (self._phase, self._window, self._left)
            self._begin(BASELINE, Window(0), self.baseline_steps)
        self._left -= 1
        k = self._window.k
        if k == 0:
            self._last_plain_step = self._step
        self._pending[self._step] = self._window
        self._window.issued += 1
        if len(self._pending) > _MAX_PENDING:
            del self._pending[next(iter(self._pending))]
        self._issued = (self._phase, k)
        self._step += 1
        return k

    def observe(self, outcome: StepOutcome) -> None:
        window = self._pending.pop(outcome.index, None)
        if window is None or not outcome.accepted or outcome.time_s is None:
            return
        try:
            time_s = float(outcome.time_s)
        except (TypeError, ValueError):
            return
        if not math.isfinite(time_s) or time_s <= 0:
            return
        if window.k == 0:
            self._plain_times.append(time_s)
        else:
            window.add(outcome.tokens_per_row, time_s, outcome.accepted, outcome.drafted, outcome.k)
            if window.steps:
                step = window.steps[-1]
                self._recent.append((outcome.index, step))
                if step.k not in self._times:
                    self._times[step.k] = deque(maxlen=self.set_steps)
                self._times[step.k].append(time_s)

    def state(self) -> dict:
        """Phase and K of the last issued step, last trial utility and the K it was measured at, the K = 0 step
        time in use, best K of the test phase, S, and why the last test phase ended."""
        phase, k = self._issued
        return {
            "phase": phase,
            "k": k,
            "utility": self._last_utility,
            "trial_k": self._trials[-1][0].k if self._trials else None,
            "baseline_s": self._baseline_s(),
            "best_k": self._best_k,
            "set_steps": self._set_len,
            "exit": self._exit,
        }

    # ----------------------------------------------------------------------------------------- state machine
    def _begin(self, phase: str, window: Window, steps: int) -> None:
        self._phase, self._window, self._left, self._extended = phase, window, steps, 0
        self._baseline_ran = self._baseline_ran or phase == BASELINE

    def _baseline_s(self) -> float | None:
        return median(self._plain_times) if self._plain_times else None

    def _refresh_due(self) -> bool:
        """The K = 0 step time is older than `baseline_refresh` steps times ``(u - 1) / tolerance`` (at least 1),
        ``u`` the best utility measured last: the K = 0 time only decides whether to speculate, so it is trusted to
        drift by ``tolerance`` per `baseline_refresh` steps, and a utility far above 1 needs it less often."""
        interval = self.baseline_refresh
        if self._margin is not None and self.tolerance > 0:
            interval *= max(1.0, (self._margin - 1.0) / self.tolerance)
        return self._step - self._last_plain_step >= interval

    def _end_segment(self) -> None:
        if self._phase == TEST:
            self._end_trial()
        elif self._phase == SET:
            self._end_set()
        elif self._paused is not None:
            self._begin(*self._paused)
            self._paused = None
        elif self._warm_off:  # the previous request ended switched off: stay off as long as it would have
            self._set_len, self._off, self._warm_off = self._warm_off, True, None
            self._begin(SET, Window(0), self._set_len)
        else:
            self._start_test()

    def _start_test(self) -> None:
        if self._refresh_due() or not self._baseline_ran:  # a test needs the K = 0 step time
            self._begin(BASELINE, Window(0), self.baseline_steps)
            return
        self._trials, self._best_k, self._exit = [], None, None
        if self._seed is not None:  # the set phase cut by K is the first trial (its steps are saturated)
            self._trials, self._seed = [(self._seed, None)], None
            self._phase = TEST
            self._decide(saturated=True)
            return
        self._begin(TEST, Window(self._first_trial_k()), self.trial_steps)

    def _first_trial_k(self) -> int:
        if self._last_set is not None and self._last_set.k == 0:
            return 1
        return self.recent_best_k() or self.start_k

    def _evidence(self) -> list[Step]:
        """The timed speculative steps issued in the last ``set_steps + max_trials * trial_steps`` steps (one test
        and one set phase; counted by issue, so outcomes that arrive late change nothing), since speculation was
        last switched on."""
        oldest = self._step - self._recent_span
        while self._recent and self._recent[0][0] < oldest:
            self._recent.popleft()
        return [step for _, step in self._recent]

    def _costs(self) -> list[float | None]:
        """`step_costs` from every K this request ran (costs depend on the model and machine, not the text)."""
        return step_costs(self._times, self.max_k)

    def _room_above(self, k: int) -> bool:
        """K + 1 might pay more than ``k`` on the recent steps: ``k < max_k``, ``k``'s utility is estimable, and
        K + 1's optimistic utility (every row cut by K would accept the next draft too; `pooled_utilities`) is
        higher, or unknown (no step ran at K + 1 yet in this request: only a trial tells its cost)."""
        if k >= self.max_k:
            return False
        steps, baseline_s, costs = self._evidence(), self._baseline_s(), self._costs()
        here = pooled_utilities(steps, [k], self.max_k, baseline_s, costs)[k]
        if here is None:
            return False
        above = pooled_utilities(steps, [k + 1], self.max_k, baseline_s, costs, optimistic=True)[k + 1]
        return above is None or above > here

    def _cut_by_k(self) -> bool:
        """Every `_CUT_STEPS` (2) steps of a set phase at 0 < K < max_k: when its last 2 timed steps (those that
        have arrived) that drafted anything accepted all K drafts in every row (K, not the drafter, limited them)
        and nothing says a larger K would not pay, the set phase ends there and becomes the first trial of a test
        phase."""
        window = self._window
        if self._phase != SET or not 0 < window.k < self.max_k or window.issued % _CUT_STEPS:
            return False
        drafting = [step for step in window.steps if step.k > 0][-_CUT_STEPS:]
        if len(drafting) < _CUT_STEPS or not all(
            a >= step.issued for step in drafting for a in step.accepted
        ):
            return False
        return self._room_above(window.k)

    def _score(self, windows: list[Window], steps: list[Step]) -> list[tuple[int, float | None]]:
        """``(K, utility)`` of each window (K > 0): `pooled_utilities` over ``steps``, else (not estimable there)
        the window's own measured utility."""
        baseline_s = self._baseline_s()
        ks = [window.k for window in windows if window.k > 0]
        pooled = pooled_utilities(steps, set(ks), self.max_k, baseline_s, self._costs())
        return [
            (w.k, None if w.timed == 0 else pooled[w.k] if pooled[w.k] is not None else w.utility(baseline_s))
            for w in windows
            if w.k > 0
        ]

    def recent_best_k(self) -> int | None:
        """The non-zero K with the best utility among the last test phase's trials and the last set phase, or
        None when nothing was measured. A new request can start its first trial there (see `warm_start`)."""
        recent = [window for window, _ in self._trials]
        if self._last_set is not None:
            recent.append(self._last_set)
        scored = [(k, u) for k, u in self._score(recent, self._evidence()) if u is not None]
        if not scored:
            return None
        return max(scored, key=lambda trial: (trial[1], -trial[0]))[0]

    def _testing_speculates(self) -> int | None:
        """In a test phase: its best K so far when that K's utility is >= 1 (else None)."""
        if self._phase != TEST:
            return None
        set_k, _ = choose_set_k([(w.k, u) for w, u in self._trials if u is not None])
        return set_k or None

    def speculating_k(self) -> int | None:
        """The K of the last set phase entered when it speculates (K > 0: its test found utility >= 1), or, in a
        test phase, its best K so far when it pays; else None."""
        if self._phase == SET and self._window.k > 0:
            return self._window.k
        testing = self._testing_speculates()
        if testing is not None:
            return testing
        if self._phase != SET and self._last_set is not None and self._last_set.k > 0 and not self._off:
            return self._last_set.k
        return None

    def switched_off_steps(self) -> int | None:
        """The length of the last set phase entered when it runs at K = 0 (speculation switched off, its back-off
        already doubled), else None; None too when a test phase since then found a K that pays (a request that
        ends in the middle of that test is not handed on as switched off)."""
        return self._set_len if self._off and self._testing_speculates() is None else None

    def remembered_baseline(self) -> tuple[float, int] | None:
        """``(K = 0 step time, steps since the last K = 0 step)`` for the next request of the same shape (see
        `warm_start`), or None before any K = 0 step was timed."""
        baseline_s = self._baseline_s()
        return None if baseline_s is None else (baseline_s, self._step - self._last_plain_step)

    def warm_start(
        self,
        k: int | None,
        switched_off_steps: int | None = None,
        set_k: int | None = None,
        baseline: tuple[float, int] | None = None,
    ) -> None:
        """Start from the previous request (call before the first `next_k`): ``k`` its `recent_best_k` (the
        first trial's K), ``switched_off_steps`` its `switched_off_steps`, ``set_k`` its `speculating_k`,
        ``baseline`` its `remembered_baseline` (only from a request of the same batch size and about the same
        context: the caller keys it).

        - switched off: the baseline, then that many K = 0 steps before the first test, so a model or workload
          where speculation does not pay stops paying for tests on every new request (the back-off carries over;
          it doubles again if the next test fails too);
        - speculating at ``set_k``: a set phase at ``set_k`` first (``set_steps`` steps), then the baseline and a
          test phase, so a request does not spend its first steps re-learning what the last one found;
        - with ``baseline``: no baseline steps until it is ``baseline_refresh`` steps old.
        """
        if k is not None and 1 <= k <= self.max_k:
            self.start_k = k
        if switched_off_steps is not None and switched_off_steps >= 1:
            self._warm_off = int(switched_off_steps)
        elif set_k is not None and 1 <= set_k <= self.max_k and self._step == 0:
            # the previous request was speculating at set_k: start there (a set phase), and measure the K = 0
            # baseline before the first test rather than before the first token
            self._begin(SET, Window(set_k), self.set_steps)
            self._baseline_ran = False
        if baseline is not None and self._step == 0 and _usable(baseline):
            # the K = 0 step time of the same shape is known, and its age carries over: the refresh every
            # `baseline_refresh` steps counts across requests, so short requests do not each pay B plain steps
            baseline_s, age = baseline
            self._plain_times.append(float(baseline_s))
            self._last_plain_step = -int(age)
            self._baseline_ran = True
            if self._phase == BASELINE:
                self._left = 0  # skip the initial baseline (`next_k` moves on to the next segment)

    def _end_set(self) -> None:
        """A set phase at K > 0 tells the utility of every K up to it (`pooled_utilities` over the recent steps).
        When all are known, K + 1 could not pay more (`_room_above`) and the best is >= 1, the next set phase runs
        at the best K without a test phase (exit ``"confident"``): at K itself unless another K beats it by more
        than ``tolerance``. Else (or when the K = 0 step time is due for a refresh) a test phase follows."""
        window = self._last_set = self._window
        if window.k > 0:
            pooled = pooled_utilities(
                self._evidence(), range(1, window.k + 1), self.max_k, self._baseline_s(), self._costs()
            )
            known = {k: u for k, u in pooled.items() if u is not None}
            if known:
                self._margin = max(known.values())
            if self._seed is None and len(known) == window.k and not self._room_above(window.k):
                best_k, best_u = max(known.items(), key=lambda item: (item[1], -item[0]))
                if best_u <= (1.0 + self.tolerance) * known[window.k]:
                    best_k, best_u = window.k, known[window.k]  # within tolerance: no reason to move
                if best_u >= 1.0 and not self._refresh_due():
                    self._trials, self._best_k, self._exit = [], best_k, "confident"
                    self._set_len, self._off = self.set_steps, False
                    self._begin(SET, Window(best_k), self._set_len)
                    return
        self._start_test()

    def _end_trial(self) -> None:
        window = self._window
        if window.timed == 0 and self._extended < self.trial_steps:
            self._extended += 1  # no outcome has arrived yet: one more step at this K
            self._left = 1
            return
        self._trials.append((window, None))
        self._decide(window.saturated)

    def _decide(self, saturated: bool) -> None:
        """After a trial (the last of `_trials`): the next trial, or the set phase and its K."""
        window = self._trials[-1][0]
        windows = [trial for trial, _ in self._trials]
        steps = [step for trial in windows for step in trial.steps]  # this test phase's: the freshest text
        last_set = self._last_set
        extra = [last_set] if last_set is not None and all(last_set.k != w.k for w in windows) else []
        scored = self._score(windows + extra, steps)  # every trial re-scored on all of them
        self._trials = [(trial, u) for trial, (_, u) in zip(windows, scored)]
        utility = self._trials[-1][1]
        self._last_utility = utility
        measured = [(trial.k, u) for trial, u in self._trials if u is not None]
        candidates = measured + [(k, u) for k, u in scored[len(windows) :] if u is not None]
        set_k, self._best_k = choose_set_k(candidates)
        if utility is None:
            next_k, self._exit = None, "unmeasured"
            if self._best_k is None:
                set_k = window.k  # nothing measured: keep speculating at this K
        else:
            next_k, self._exit = plan_next_trial(
                measured, self.max_k, self.max_trials, self.tolerance, saturated=saturated
            )
        if next_k is not None:
            self._exit = None
            self._begin(TEST, Window(next_k), self.trial_steps)
            return
        if set_k == 0:
            # switching off is the costly mistake when the text just turned good (pooled over the phase, the
            # older trials outvote the last): only when no trial's own steps say a K pays either
            own = [(trial.k, u) for trial in windows if (u := trial.utility(self._baseline_s())) is not None]
            set_k, own_best = choose_set_k(own)
            if set_k:
                self._best_k = own_best
        if candidates:
            self._margin = max(u for _, u in candidates)
        self._set_len = 2 * self._set_len if set_k == 0 else self.set_steps
        self._off = set_k == 0
        if self._off:
            self._recent.clear()  # what speculation did before it was switched off says little after
        self._begin(SET, Window(set_k), self._set_len)
