"""The planner behind ``strategy="auto"``: at every step, which drafter drafts and how many tokens (K = 0: a plain
decode step), chosen by measured speed.

Cascade's utility (papers/002) generalised across drafters, with SSV's profile (papers/003) as the cost model::

    utility(m, K) = tokens(m, K) / cost(m, K)          (tokens per row per second)

- ``tokens(m, K)``: tokens the call's *critical row* emits per step when drafter ``m`` proposes K. Each row's
  expected tokens are 1 + the sum of its survival ``P(run >= j)`` for j = 1 .. K, a Kaplan-Meier estimate over
  ``m``'s recent runs on that row (`run_length_survival`'s rule, recent runs weighted more: half weight every
  `_HALF_LIFE` runs, and runs not known to follow a run of the kind of the row's newest (a hit or a miss) by
  `_OTHER_REGIME`: prompt lookup's runs come in streaks, and the next run follows the newest); where the row's own
  runs at a draft position are few, it borrows the all-rows estimate there (`row_expected_tokens`). Past the
  longest run seen, survival falls geometrically at its last observed ratio (at most `_EXTRAPOLATION_RATIO`). Only
  rows still generating count: a row that finished stops vouching for a drafter. The critical row is the one that
  needs the most steps to finish (remaining tokens over expected tokens): a static batch runs as many steps as it
  needs, so a drafter that races through copy-heavy rows but proposes nothing useful for the others finishes the
  call no sooner than a plain step would. Drafts are text-dependent: runs are never carried from another call.
  Prompt lookup's proposals are also scored while other drafters draft (`PortfolioDrafter` compares what it would
  have proposed with the tokens committed: greedy output is the same whatever drafts), so the planner sees when
  the text turns copyable without a trial.
- ``cost(m, K)``: the step's draft + verify + update seconds, from a `CostProfile`: medians of measured parts,
  verify by width (shared by every drafter: it is the target's forward), draft by drafter and K (a line through
  the Ks measured; prompt lookup's search does not grow with K), update by drafter. The profile belongs to the
  model, the drafter set and the shape bucket (batch, prompt length within 2x): it is kept across calls, so a
  later call knows every cost from its first step, and every timed step refreshes it (CUDA events).

Per step (`next_step`):

1. **baseline**: while the plain step's cost is unknown, K = 0 (``baseline_steps`` steps; none when the profile
   already has it).
2. **trial**: a drafter is due for a trial when it has not drafted in this call, or when ``backoff[m]`` steps
   passed since it last did (the back-off doubles each time a trial ends with the drafter not best, from
   ``first_backoff``). A trial runs ``trial_steps`` steps at the drafter's best K so far (its start K at first)
   and ends early once its measured utility is below ``give_up`` times the best's. The most promising due drafter
   goes first. Where the profile prices a drafter, its first trial runs only if it could beat the best choice so
   far at a high prior acceptance. A drafter with a one-off cost before its first draft (a draft model's own
   prefill) is tried only when that cost is under ``warm_share`` of the decoding still ahead at the best rate so far.
3. **exploit**: the (drafter, K) of highest utility, K up to 1.5 times the largest K in the drafter's evidence
   (so K climbs on evidence, by half at most per step; any K for a drafter whose cost does not grow with K); a
   switch of drafter needs ``switch_margin`` more utility than staying. K = 0 when nothing beats a plain step.

Every choice is lossless: a step's output is the target's whatever drafted it, so greedy output equals plain
``generate`` and sampling keeps the target's distribution, whatever the planner picks.

Example (drafter ``a`` is right up to 2 tokens and cheap, ``b`` is never right):
    >>> from hf_sparse_verify.generation.policies.k_policy import StepOutcome
    >>> planner = Planner({"a": Member(start_k=4), "b": Member(start_k=4)}, max_k=8, batch=1)
    >>> picks = []
    >>> for i in range(40):
    ...     member, k = planner.next_step(remaining=1000)
    ...     picks.append((member or "k0", k))
    ...     accepted = [min(k, 2)] if member == "a" else [0]
    ...     planner.observe(StepOutcome(i, k, accepted, 1.0 + 0.1 * k, extra={
    ...         "member": member, "parts": (0.1 * k, 0.9 + 0.02 * k, 0.1)}))
    >>> picks[:2], picks[-1]
    ([('k0', 0), ('k0', 0)], ('a', 2))
"""

from __future__ import annotations

import functools
import math
import time
from collections import deque
from dataclasses import dataclass
from statistics import median

import numpy as np

from .k_policy import KPolicy, StepOutcome

#: the plain step's name in profiles and stats
K0 = "k0"
#: measurements kept per cost entry (the most recent)
_COST_WINDOW = 32
#: runs kept per row and drafter (the most recent of this call)
_ROW_WINDOW = 24
#: a run this many runs older than a row's newest weighs half as much (the estimate follows the text within a few
#: steps: one H100, 1 x 16K, prompt lookup kept K = 13 for 20 steps with a 24-step unweighted window)
_HALF_LIFE = 6.0
#: a run's weight by its age in runs (0 .. `_ROW_WINDOW` - 1)
_DECAY = 0.5 ** (np.arange(_ROW_WINDOW) / _HALF_LIFE)
#: weight of a run not known to follow a run of the kind (hit: >= 1 draft accepted; miss: none) of the row's newest
_OTHER_REGIME = 0.2
#: pseudo-runs at the all-rows hazard a row's estimate at draft position j gets when it has no own runs at risk there
#: (fewer where it has some; see `row_expected_tokens`)
_ROW_PRIOR = 2.0
#: a row's own runs (by weight) at risk at j from which its estimate there is its own alone
_OWN_RUNS = 3.0
#: at most this share of the runs that reached the longest K seen is taken to go one further (a censored estimate
#: beyond what was tried; K climbs to where it is measured). One H100, 4 x 16K: at 0.85 Vegas stayed at K = 3 with
#: nearly every draft accepted (K = 6 runs 14% faster there)
_EXTRAPOLATION_RATIO = 0.92
#: acceptance per draft token a first trial is priced with (a very good drafter on friendly text): a drafter that
#: cannot beat the best choice so far even so is not tried (see `Planner._first_trial_k`). One H100, run4 of
#: bench_e2e: at 1 x 4K trials of Vegas and the draft model while prompt lookup ran at 12.8 tokens per step cost 12%
_PRIOR_ACCEPTANCE = 0.9
#: calls of a profile whose acceptance per drafter is kept: a drafter's first trial in a call is priced at the best
#: of them (`CostProfile.prior_acceptance`). One H100, bench_e2e's mixed workload: every call tried the draft model
#: and Vegas again at the 0.9 prior (the draft model never won a call, and its trials cost its own prefill)
_CALLS_KEPT = 8
#: pseudo-runs at `_PRIOR_ACCEPTANCE` each call's acceptance is shrunk with (a two-step trial on one row is thin
#: evidence: one unlucky trial must not keep a drafter out for `_CALLS_KEPT` calls)
_PRIOR_RUNS = 2.0
#: steps an estimate made by `Planner.prepare` is kept (sooner cleared by a trial, a drafter's first runs, a row
#: that finished)
_REPLAN_EVERY = 4
#: share of the steps' seconds the planner may spend renewing estimates (`Planner.plan_share`). The fixtures' steps
#: are host-bound (0.5-3 ms, the device mostly waiting on the host), so every host second of planning lengthens the
#: call (one H200, run19/run20 of bench_e2e: 0.12-0.65 ms of planning per step left `auto` at 0.74-0.93x prompt
#: lookup's utility policy at 1 x 4K with the very same choices). One H100, run22, median `auto` / best single case
#: over the five shapes: 0.91 at 0.05, 0.86 at 0.25, 0.89 unlimited (rationing costs choices too: at 0.05 and 1 x 16K
#: Vegas' estimate from its trial was kept 34 plain steps)
PLAN_SHARE = 0.05
#: measurements after which `CostProfile.costs` recomputes its vectors (sooner when a new entry appears)
_COST_REFRESH = 8
#: a drafter's estimate is renewed (urgently) after `_SURPRISES` of its steps in a row whose tokens per row fell
#: short of its estimate by a factor of `_SURPRISE` or more
_SURPRISE = 2.0
_SURPRISES = 2
#: steps a switch of drafter is expected to last: a drafter's extra seconds on its first step after another drafted
#: (a draft model's catch-up on the tokens committed meanwhile: 2.8-5.4 ms against 1.5 ms, one H100, 32 x 8K, run12)
#: are spread over this many steps when a switch to it is weighed
_SWITCH_HORIZON = 8
#: relative verify cost of one more token per row when only one width was ever measured (a prior; measured widths
#: replace it: one H100 with code-target measured 5-6% at 1-16 rows x 16K, bf16)
_VERIFY_SLOPE_PRIOR = 0.08


@dataclass(frozen=True)
class Member:
    """What the planner knows of one drafter before it runs.

    Attributes:
        start_k: K of its first trial.
        draft_grows_with_k: drafting K tokens costs about K times one (a draft model, self-speculation); False
            for prompt lookup, whose search costs the same for any K.
        warm_share: its one-off cost before the first draft as a share of the target's prefill (a draft model's
            own prefill: about its parameter count over the target's); 0 for none.
    """

    start_k: int = 4
    draft_grows_with_k: bool = True
    warm_share: float = 0.0


def _line(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """``(mean x, mean y, slope)`` of the least-squares line through two or more points of distinct x."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return mean_x, mean_y, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


class CostProfile:
    """Measured step parts of one model, drafter set and shape bucket: verify seconds by width, draft seconds by
    (drafter, K), update seconds by drafter; each a median of the last `_COST_WINDOW` measurements.

    Example:
        >>> profile = CostProfile()
        >>> for _ in range(3):
        ...     profile.add(K0, 0, 0.0, 1.0, 0.2)
        ...     profile.add("a", 4, 0.4, 1.2, 0.2)
        >>> round(profile.cost(K0, 0), 3), round(profile.cost("a", 4), 3), round(profile.cost("a", 2), 3)
        (1.2, 1.8, 1.5)
    """

    def __init__(self) -> None:
        self.verify: dict[int, deque] = {}
        self.draft: dict[tuple[str, int], deque] = {}
        self.update: dict[str, deque] = {}
        self.grows: dict[str, bool] = {}
        self._medians: dict[
            tuple[str, object], float
        ] = {}  # (table, key) -> median, dropped when the entry grows
        self._adds = 0  # measurements added
        self._entries = 0  # entries created (a new width, drafter or K)
        self._vectors: dict = {}  # (member, max_k) -> (entries, adds, `costs`) when last computed
        self._verify_vector: tuple = (None, None)  # ((adds, entries, max_k), verify seconds at K = 0 .. max_k)
        # per drafter, extra draft seconds of its first step after another drafter's (or plain) steps
        self.switch: dict[str, deque] = {}
        # per drafter, the last `_CALLS_KEPT` calls' [drafts accepted, runs ended by a rejection]
        self.acceptance: dict[str, deque] = {}

    def add(self, member: str, k: int, draft_s: float, verify_s: float, update_s: float) -> None:
        for name, table, key, value in (
            ("verify", self.verify, k + 1, verify_s),
            ("draft", self.draft, (member, k), draft_s),
            ("update", self.update, member, update_s),
        ):
            if math.isfinite(value) and value >= 0:
                if key not in table:
                    table[key] = deque(maxlen=_COST_WINDOW)
                    self._entries += 1
                table[key].append(value)
                self._medians.pop((name, key), None)
        self._medians.pop(("pooled", member), None)
        self._medians.pop(("line", member), None)
        self._medians.pop(("slope", None), None)
        self._adds += 1

    def _med(self, name: str, key) -> float:
        """The entry's median; of fewer than 3 measurements the least (a drafter's first step in a call can carry
        a one-off cost: an index build, a catch-up)."""
        cached = self._medians.get((name, key))
        if cached is None:
            values = getattr(self, name)[key]
            cached = self._medians[(name, key)] = median(values) if len(values) >= 3 else min(values)
        return cached

    def add_switch(self, member: str, extra_s: float) -> None:
        """Extra draft seconds ``member`` took on a step right after a switch to it."""
        if math.isfinite(extra_s):
            self.switch.setdefault(member, deque(maxlen=_COST_WINDOW)).append(max(0.0, extra_s))

    def switch_s(self, member: str) -> float:
        """Median extra seconds of a switch to ``member`` (0 before any was measured)."""
        values = self.switch.get(member)
        return median(values) if values else 0.0

    def start_call(self, members) -> None:
        """Opens this call's acceptance record for each of ``members``."""
        for name in members:
            self.acceptance.setdefault(name, deque(maxlen=_CALLS_KEPT)).append([0, 0])

    def add_runs(self, member: str, accepted: int, ended: int) -> None:
        """Runs of ``member`` in the current call: ``accepted`` drafts in all, ``ended`` of them cut by a rejection."""
        calls = self.acceptance.get(member)
        if calls:
            calls[-1][0] += accepted
            calls[-1][1] += ended

    def prior_acceptance(self, member: str) -> float:
        """Acceptance per draft a first trial of ``member`` is priced with: the best over the earlier calls of this
        profile where it ran, each call's censored-geometric estimate (drafts accepted over accepted plus runs
        ended by a rejection) shrunk toward `_PRIOR_ACCEPTANCE` by `_PRIOR_RUNS` pseudo-runs; `_PRIOR_ACCEPTANCE`
        when it ran in none of them."""
        best = None
        for accepted, ended in list(self.acceptance.get(member, ()))[:-1]:  # the current call is the last
            if accepted + ended > 0:
                alpha = (accepted + _PRIOR_RUNS * _PRIOR_ACCEPTANCE) / (accepted + ended + _PRIOR_RUNS)
                best = alpha if best is None else max(best, alpha)
        return _PRIOR_ACCEPTANCE if best is None else min(best, _PRIOR_ACCEPTANCE)

    def to_dict(self) -> dict:
        """The measurements, JSON-ready (what `hf_sparse_verify.generation.profiles` saves beside a model)."""
        return {
            "verify": {str(w): list(v) for w, v in self.verify.items()},
            "draft": {f"{m}:{k}": list(v) for (m, k), v in self.draft.items()},
            "update": {m: list(v) for m, v in self.update.items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        profile = cls()
        window = functools.partial(deque, maxlen=_COST_WINDOW)
        profile.verify = {int(w): window(v) for w, v in data.get("verify", {}).items()}
        for key, values in data.get("draft", {}).items():
            member, _, k = key.rpartition(":")
            profile.draft[(member, int(k))] = window(values)
        profile.update = {m: window(v) for m, v in data.get("update", {}).items()}
        return profile

    def known(self, member: str) -> bool:
        return member in self.update

    def verify_s(self, width: int) -> float | None:
        """Verify seconds at ``width`` tokens per row: measured, else interpolated between the nearest measured
        widths, else (outside them) extended from the nearest measured width along the least-squares slope of all
        of them (not the slope of the last two: two close widths' noisy medians can slope steeply and price every
        wider verify out, which kept K = 13 with every draft accepted at 1 x 4K on one H100); from one measured
        width, the prior slope."""
        seen = sorted(self.verify)
        if not seen:
            return None
        if width in self.verify:
            return self._med("verify", width)
        if len(seen) == 1:
            base = self._med("verify", seen[0])
            return max(0.0, base * (1.0 + _VERIFY_SLOPE_PRIOR * (width - seen[0])))
        below = [w for w in seen if w < width]
        above = [w for w in seen if w > width]
        if below and above:
            low, high = below[-1], above[0]
            low_s, high_s = self._med("verify", low), self._med("verify", high)
            return max(0.0, low_s + (high_s - low_s) * (width - low) / (high - low))
        nearest = seen[-1] if below else seen[0]
        return max(0.0, self._med("verify", nearest) + self._verify_slope() * (width - nearest))

    def _verify_slope(self) -> float:
        """Seconds per verify token: the least-squares slope over every measured width (not below 0)."""
        cached = self._medians.get(("slope", None))
        if cached is None:
            _, _, slope = _line([(w, self._med("verify", w)) for w in sorted(self.verify)])
            cached = self._medians[("slope", None)] = max(0.0, slope)
        return cached

    def draft_s(self, member: str, k: int) -> float | None:
        """Draft seconds of ``member`` at K: measured; else between the nearest measured Ks, interpolated; else
        (outside them) extended from the nearest along the least-squares slope of all of them, never downwards (a
        drafter whose drafting grows with K is not cheaper at a larger K); from one measured K, through the origin.
        A drafter whose cost does not grow with K (prompt lookup's search) is priced by the median of all its steps
        at every K, including those that found nothing: a one-off cost at one K (a kernel compiled for it, say)
        then cannot price that K out for the rest of the profile's life."""
        grows = self.grows.get(member, True)
        if not grows and k > 0:
            cached = self._medians.get(("pooled", member))
            if cached is None:
                pooled = [v for (m, _), values in self.draft.items() if m == member for v in values]
                if not pooled:
                    return None
                cached = self._medians[("pooled", member)] = median(pooled)
            return cached
        if (member, k) in self.draft:
            return self._med("draft", (member, k))
        if k == 0:  # a plain step, or a drafter that found nothing to propose: its search still ran
            return 0.0
        line = self._medians.get(("line", member))
        if line is None:  # the measured (K, seconds), and the least-squares slope through them (None from one)
            seen = sorted((kk, self._med("draft", (m, kk))) for m, kk in self.draft if m == member and kk > 0)
            slope = max(0.0, _line(seen)[2]) if len(seen) > 1 else None
            line = self._medians[("line", member)] = (seen, slope)
        seen, slope = line
        if not seen:
            return None
        if slope is None:
            kk, s = seen[0]
            return s * k / kk
        below = [p for p in seen if p[0] < k]
        above = [p for p in seen if p[0] > k]
        if below and above:  # between two measured Ks (a line through all of them lets one inflated K tilt it)
            (low, low_s), (high, high_s) = below[-1], above[0]
            return low_s + (high_s - low_s) * (k - low) / (high - low)
        nearest, nearest_s = below[-1] if below else above[0]
        return max(0.0, nearest_s + slope * (k - nearest))

    def costs(self, member: str, max_k: int) -> np.ndarray | None:
        """`cost` of ``member`` at every K = 0 .. max_k at once (NaN where not estimable; None when nothing is). Kept
        for `_COST_REFRESH` measurements while no new entry appears (medians of `_COST_WINDOW` move slowly; the
        planner asks every step)."""
        kept = self._vectors.get((member, max_k))
        if kept is not None and kept[0] == self._entries and self._adds - kept[1] < _COST_REFRESH:
            return kept[2]
        vector = self._costs(member, max_k)
        self._vectors[(member, max_k)] = (self._entries, self._adds, vector)
        return vector

    def _costs(self, member: str, max_k: int) -> np.ndarray | None:
        """`cost` at K = 0 .. max_k (NaN where None), the verify part shared by every drafter's vector."""
        update = self.update_s(member)
        if update is None or not self.verify:
            return None
        key = (self._adds, self._entries, max_k)
        if self._verify_vector[0] != key:
            self._verify_vector = (key, np.array([self.verify_s(k + 1) for k in range(max_k + 1)]))
        verify = self._verify_vector[1]
        draft = np.array([np.nan if (d := self.draft_s(member, k)) is None else d for k in range(max_k + 1)])
        costs = draft + verify + update
        return None if np.isnan(costs).all() else costs

    def update_s(self, member: str) -> float | None:
        return self._med("update", member) if member in self.update else self._any_update()

    def cost(self, member: str, k: int) -> float | None:
        """Seconds of one step of ``member`` at K (``K0`` at 0: a plain step); None when not estimable."""
        draft = self.draft_s(member, k)
        verify = self.verify_s(k + 1)
        update = self.update_s(member)
        if draft is None or verify is None or update is None:
            return None
        return draft + verify + update

    def _any_update(self) -> float | None:
        values = [self._med("update", m) for m in self.update]
        return min(values) if values else None


def row_expected_tokens(
    age: np.ndarray, issued: np.ndarray, accepted: np.ndarray, max_k: int, weight: np.ndarray | None = None
) -> np.ndarray:
    """Expected tokens per step of each row at K = 0 .. max_k, from its recent runs: ``[R, max_k + 1]``.

    ``age``, ``issued``, ``accepted``: ``[R, W]`` runs per row (``age`` in runs behind the newest, negative for an
    empty slot). Each row's Kaplan-Meier survival over its runs (a run that accepted every draft issued is censored
    there, `run_length_survival`'s rule), runs weighted ``0.5 ** (age / _HALF_LIFE)``; where a row's own runs at
    risk at j weigh under `_OWN_RUNS`, up to `_ROW_PRIOR` pseudo-runs at the all-rows hazard; past the longest run
    seen, falling at the last observed ratio (at most `_EXTRAPOLATION_RATIO`). Tokens at K = 1 + P(run >= 1) + ... + P(run >= K).

    Example (row 0 accepts all 2 drafts every time, row 1 none):
        >>> age = np.array([[0, 1, 2], [0, 1, 2]])
        >>> tokens = row_expected_tokens(age, np.full((2, 3), 2), np.array([[2, 2, 2], [0, 0, 0]]), 3)
        >>> bool(tokens[0, 2] > 2.5 and tokens[1, 2] < 1.5 and tokens[0, 3] > tokens[0, 2])
        True
    """
    rows = age.shape[0]
    if weight is None:
        weight = np.where(age >= 0, 0.5 ** (np.maximum(age, 0) / _HALF_LIFE), 0.0)  # [R, W]
    capped = np.minimum(accepted, max_k)
    ended = (accepted < issued) & (accepted < max_k)  # uncensored: the run is exactly ``accepted``
    # weight of each row's runs by drafts accepted (0 .. max_k), all runs and the uncensored ones
    slot = (np.arange(rows)[:, None] * (max_k + 1) + capped).ravel()
    runs = np.bincount(slot, weight.ravel(), rows * (max_k + 1)).reshape(rows, max_k + 1)
    exact = np.bincount(slot, (weight * ended).ravel(), rows * (max_k + 1)).reshape(rows, max_k + 1)
    survived = np.cumsum(runs[:, ::-1], axis=1)[:, ::-1][:, 1:]  # [R, K]: runs known to reach j = 1 .. K
    died = exact[:, :-1]  # runs ending at exactly j - 1
    pooled_risk = survived.sum(axis=0) + died.sum(axis=0)  # [K]
    known = int((pooled_risk > 0).sum())  # a prefix of the Ks: no run reaches past where all stopped
    # where a row's own runs at risk at j weigh under `_OWN_RUNS`, pseudo-runs at the all-rows hazard make up the
    # rest of `_ROW_PRIOR`: a row with plenty of its own runs at j keeps its own rate there (a row prompt lookup
    # misses must not borrow its neighbours' long runs), one with few borrows (one unlucky run must not pin a row
    # at K = 1, where its later runs never test j = 2)
    pooled_hazard = died.sum(axis=0) / np.maximum(pooled_risk, 1e-30)
    prior = _ROW_PRIOR * np.clip(1.0 - (survived + died) / _OWN_RUNS, 0.0, 1.0) * (pooled_risk > 0)
    survived = survived + prior * (1.0 - pooled_hazard)
    died = died + prior * pooled_hazard
    at_risk = survived + died
    survival = np.ones((rows, max_k + 1))
    if known:
        hazard = died[:, :known] / np.maximum(at_risk[:, :known], 1e-30)
        survival[:, 1 : known + 1] = np.cumprod(1.0 - hazard, axis=1)
    if known < max_k:
        if known == 0:
            ratio = np.zeros(rows)
        else:
            before = survival[:, known - 1]
            ratio = np.where(
                before > 0,
                np.minimum(_EXTRAPOLATION_RATIO, survival[:, known] / np.maximum(before, 1e-30)),
                0.0,
            )
        powers = np.arange(1, max_k - known + 1)
        survival[:, known + 1 :] = survival[:, known : known + 1] * ratio[:, None] ** powers
    return np.cumsum(survival, axis=1)


def batch_pace(per_row: np.ndarray, weight: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Tokens per step at K = 0 .. max_k by which a static batch's end comes nearer: the most remaining tokens over
    the expected steps of the row that finishes last.

    ``per_row``: `row_expected_tokens` of the active rows ``[R, K + 1]``; ``weight``: their effective count of runs
    ``[R]``;
    ``remaining``: tokens each may still generate ``[R]``. Two things make a batch slower than its mean row:
    - rows differ (a row prompt lookup finds nothing to copy in): each row's rate, shrunk toward the rows' mean as
      far as its own runs are thin against the spread between rows (an empirical-Bayes estimate), so one row's
      unlucky runs do not pass for a slow row. The price: one slow row among many alike is shrunk toward them
      (one fresh request among copy-heavy ones reads about half-way to the mean);
    - luck: a row needing ``n`` steps at ``m`` tokens per step with spread ``s`` per step (the variance of its run
      lengths, from the same survival curve) lags ``z * s * sqrt(n)`` tokens behind, and the last of ``R`` rows
      lags by ``z = sqrt(2 ln R)`` (the largest of R normal deviates). A drafter whose runs come in bursts (prompt
      lookup: 0 or 16) pays this most.
    One H200, bench_e2e at 32 x 8K: prompt lookup's mean row ran 4.0 tokens per step, the slowest 2.4 per step over
    the call (255 / 106 steps), where the least of the rows' recent estimates (what the planner used) said 1.0 and
    chose Vegas at 0.67x prompt lookup's speed; this estimate gives about 2.5 there.

    Example (16 rows that all run 0 or 8 drafts by turns: the batch is slower than the mean row, not stuck at 1):
        >>> runs = np.array([[1.0] + [0.5] * 8])  # survival 1 then 0.5 up to K = 8
        >>> per_row = np.repeat(np.cumsum(runs, axis=1), 16, axis=0)
        >>> pace = batch_pace(per_row, np.full(16, 6.0), np.full(16, 256.0))
        >>> bool(2.0 < pace[8] < per_row[0, 8] - 1.0)
        True
    """
    count = per_row.shape[0]
    if count == 1:  # one row: its own rate (no spread between rows, no last of several to lag), capped by its end
        return np.maximum(np.minimum(per_row[0], max(float(remaining[0]), 1.0)), 1.0)
    survival = np.diff(per_row, axis=1, prepend=0.0)  # P(tokens >= j + 1)
    second = np.cumsum(survival * (2.0 * np.arange(per_row.shape[1]) + 1.0), axis=1)  # E[tokens ** 2]
    spread = np.maximum(second - per_row**2, 0.0)  # [R, K + 1]
    z = math.sqrt(2.0 * math.log(count)) if count > 1 else 0.0
    if count > 1:
        mean = per_row.mean(axis=0)
        noise = spread.mean(axis=0) / np.maximum(weight, 1.0)[:, None]  # [R, K + 1]: variance of a row's mean
        between = np.maximum(per_row.var(axis=0) - noise.mean(axis=0), 0.0)  # spread of the rows' true rates
        kept = between / np.maximum(between + noise, 1e-12)
        per_row = mean + kept * (per_row - mean)
    remaining = np.maximum(remaining, 1.0)[:, None]
    rate = np.maximum(np.minimum(per_row, remaining), 1.0)
    steps = remaining / rate
    lag = z * np.sqrt(spread * steps)  # tokens behind after those steps
    pace = np.maximum((remaining - lag) / steps, 1.0)  # [R, K + 1]
    return remaining.max() / (remaining / pace).max(axis=0)


class _Runs:
    """One drafter's recent runs per row of this call, the last `_ROW_WINDOW` of each row: (K issued, drafts
    accepted) in a ring per row (a run's age is counted in runs, not steps: a drafter tried again after 48 steps
    keeps what its last trial found). Arrays, so that an estimate over 32 rows reads them without a Python loop
    (the planner runs on the host while the device verifies; its estimates must fit in that time)."""

    def __init__(self, batch: int):
        rows = max(batch, 1)
        self.issued = np.zeros((rows, _ROW_WINDOW), dtype=np.int64)
        self.accepted = np.zeros((rows, _ROW_WINDOW), dtype=np.int64)
        self.order = np.full((rows, _ROW_WINDOW), -1, dtype=np.int64)  # the run's number in its row; -1: empty
        self.count = np.zeros(rows, dtype=np.int64)  # runs ever added per row

    def _grow(self, rows: int) -> None:
        extra = rows - len(self.count)
        pad = ((0, extra), (0, 0))
        self.issued, self.accepted = np.pad(self.issued, pad), np.pad(self.accepted, pad)
        self.order = np.pad(self.order, pad, constant_values=-1)
        self.count = np.pad(self.count, (0, extra))

    def add_rows(self, rows: list[int], issued: list[int], accepted: list[int]) -> None:
        if not rows:
            return
        if max(rows) >= len(self.count):  # more rows than announced
            self._grow(max(rows) + 1)
        index = np.asarray(rows)
        number = self.count[index]  # each run's number in its row
        if len(set(rows)) < len(rows):  # a row twice (two scored proposals at once): numbered in order
            seen: dict[int, int] = {}
            later = []
            for r in rows:
                later.append(seen.get(r, 0))
                seen[r] = later[-1] + 1
            number = number + np.asarray(later)
        slot = number % _ROW_WINDOW
        self.issued[index, slot] = issued
        self.accepted[index, slot] = accepted
        self.order[index, slot] = number
        np.maximum.at(self.count, index, number + 1)

    def _known(self, rows) -> np.ndarray:
        return np.asarray([r for r in rows if r < len(self.count)], dtype=np.int64)

    def any(self, rows) -> bool:
        return bool(self.count[self._known(rows)].any())

    def largest_k(self, rows) -> int:
        known = self._known(rows)
        if not len(known):
            return 0
        return int(np.where(self.order[known] >= 0, self.issued[known], 0).max())

    def expected_tokens(self, rows, max_k: int) -> tuple[np.ndarray, np.ndarray]:
        """`row_expected_tokens` of ``rows``, and each row's effective count of runs (``(sum w) ** 2 / sum w ** 2``
        of their weights ``w = 0.5 ** (age / _HALF_LIFE)``)."""
        index = np.asarray(rows, dtype=np.int64)
        inside = index < len(self.count)
        safe = np.where(inside, index, 0)
        order = self.order[safe]
        if not inside.all():
            order = np.where(inside[:, None], order, -1)
        count = self.count[safe][:, None]
        filled = order >= 0
        age = np.where(filled, count - 1 - order, -1)  # 0 .. _ROW_WINDOW - 1 where filled
        issued, accepted = self.issued[safe], self.accepted[safe]
        weight = np.where(filled, _DECAY[np.maximum(age, 0)], 0.0)
        if _OTHER_REGIME < 1.0:
            # runs not known to follow a run of the kind of the row's newest (a hit: a draft accepted; a miss: none)
            # weigh less: the next run follows the newest, and prompt lookup's runs come in streaks (copied text,
            # then fresh text). Run n sits in slot n % _ROW_WINDOW, so the run before a slot's sits in the slot
            # before it, where it is still kept unless it is older than the window
            hit = accepted > 0
            known = filled & (order >= 1) & (order - 1 >= count - _ROW_WINDOW)
            before_hit = np.roll(hit, 1, axis=1)
            newest_hit = hit[np.arange(len(safe)), np.maximum(count[:, 0] - 1, 0) % _ROW_WINDOW][:, None]
            weight = weight * np.where(known & (before_hit == newest_hit), 1.0, _OTHER_REGIME)
        runs = weight.sum(axis=1) ** 2 / np.maximum((weight**2).sum(axis=1), 1e-12)
        return row_expected_tokens(age, issued, accepted, max_k, weight), runs


@dataclass
class _Trial:
    member: str
    k: int
    steps_left: int
    observed: int = 0


@dataclass
class _MemberState:
    runs: _Runs
    short: (
        deque  # K of its recent drafting steps that ran shorter than issued (it had fewer drafts), else None
    )
    last_step: int | None = None  # step index it last drafted at
    backoff: int = 0
    steps: int = 0  # evidence updates (its own steps and scored proposals)
    tokens: tuple | None = None  # ((its ``steps``, active rows), expected tokens [R, K + 1]) of its runs
    shadowed: bool = False  # its proposals are scored while others draft (prompt lookup): no trial needed
    hits: float | None = None  # share of the rows that accepted a draft at its last step
    surprises: int = 0  # its steps in a row whose tokens per row fell short of its estimate by `_SURPRISE` or more


class Planner(KPolicy):
    """Chooses the drafter and K of every step (see the module docstring).

    Args:
        members: drafter name -> `Member`.
        max_k: largest K (the verify graphs cover 1 .. max_k + 1 tokens).
        batch: rows of the call (a trial needs fewer steps when many rows report).
        profile: the `CostProfile` of this model, drafter set and shape bucket (shared with later calls).
        plan_share: at most this share of the steps' seconds goes to renewing estimates (the host's time measured;
            renewals an outcome made urgent go first when one fits); None: no limit (the choices then do not depend
            on the host's speed). `PLAN_SHARE` in ``generate``.
    """

    needs_timing = True
    plans_drafters = True

    def __init__(
        self,
        members: dict[str, Member],
        max_k: int,
        batch: int = 1,
        profile: CostProfile | None = None,
        *,
        baseline_steps: int = 2,
        trial_steps: int | None = None,
        first_backoff: int = 24,
        give_up: float = 0.8,
        switch_margin: float = 0.05,
        warm_share: float = 0.1,
        plan_share: float | None = None,
    ):
        super().__init__(0, max_k)
        if not members:
            raise ValueError("the planner needs at least one drafter")
        self.members = dict(members)
        self.profile = profile if profile is not None else CostProfile()
        for name, member in self.members.items():
            self.profile.grows[name] = member.draft_grows_with_k
        self.profile.start_call(self.members)
        self.baseline_steps = baseline_steps
        self.trial_steps = trial_steps if trial_steps is not None else (2 if batch < 4 else 1)
        self.first_backoff = first_backoff
        self.give_up = give_up
        self.switch_margin = switch_margin
        self.warm_share = warm_share
        self.plan_share = plan_share
        self._renew_s: float | None = None  # host seconds of a drafter's renewal (moving average)
        self._renewed_step = 0  # the step of the last one
        self.batch = max(1, batch)
        self.state_of = {
            name: _MemberState(_Runs(self.batch), deque(maxlen=_ROW_WINDOW), backoff=first_backoff)
            for name in self.members
        }
        self.step = 0  # index of the next step
        self.baseline_left = 0 if self.profile.cost(K0, 0) is not None else baseline_steps
        self.trial: _Trial | None = None
        self.exploiting: str | None = None  # the drafter chosen as best at the last step that was not a trial
        # estimates for the next choice, keyed ``(what, drafter or K0, ...)`` (each kept `_REPLAN_EVERY` steps; see
        # `prepare`, `_take`)
        self._memo: dict = {}
        self._first_k: dict[str, int] = {}  # K of a due drafter's first trial
        self._pending: deque[StepOutcome] = deque()  # outcomes observed, not yet taken in
        self._unabsorbed: list[tuple] = []  # outcomes taken in, not yet in the runs and the profile (`_absorb`)
        self._next: tuple | None = None  # ((drafter, K), reason) `prepare` chose for the next step
        self._remaining = max_k + 1  # the most tokens a row needed at the last `next_step`
        self._estimates: dict = {}  # what the last `prepare` estimated (reported by `state`)
        self._filled: tuple[str, int] | None = (
            None  # (drafter, K) of the last step if every row accepted all K
        )
        self._last_ran = K0  # the drafter (or plain) of the last outcome taken in
        self._refreshed: dict[str, int] = {}  # per drafter (and K0), the step its `_memo` estimates were made at
        self._urgent: list[str] = []  # drafters whose estimates `prepare` renews first (see `_stale`)
        self.active: list[bool] = []  # rows still generating after the last step
        self.remaining_rows: list[int] = []  # tokens each row may still generate (max_length - its length)
        self.current: tuple[str | None, int] = (None, 0)
        self.prefill_s: float | None = None
        self.last_reason = ""

    @property
    def k_bound(self) -> int:
        return self.max_k

    # ------------------------------------------------------------------------------------------------ inputs
    def begin(self, prefill_s: float | None) -> None:
        """The target's prefill seconds of this call (prices a draft model's own prefill)."""
        self.prefill_s = prefill_s

    def prepare(self) -> None:
        """The next step's choice, made while the device verifies this step (the loop calls this between enqueuing
        the verify and reading it back): the outcomes observed so far are taken in, estimates made, and the choice
        kept for `next_step`. The choice then lags the evidence by one step (this step's outcome is not read yet),
        and the host's planning hides behind the device's work instead of stalling it between steps (one H100,
        bench_e2e run8: planning after the readback took 0.5-0.9 ms per step, as much as a whole 1 x 4K step).
        A drafter's estimates are kept for `_REPLAN_EVERY` steps, renewed sooner after its trial step, its first runs
        or its scored proposals all accepted; a finished row makes all due; one drafter's are renewed per step at
        most, and only within ``plan_share`` of the steps' seconds (urgent ones first)."""
        self._take_in(kept=True)
        if (
            self._filled is not None
            and self._filled == self.current
            and self.current[1] >= self.max_k
            and not self.members[self.current[0]].draft_grows_with_k
            and self.trial is None
        ):
            # every row accepted every draft at the largest K from a drafter whose drafting costs the same at any K
            # (prompt lookup's search): no choice emits more per step, and any other drafts dearer, so the step goes
            # on unplanned (one H100, 1 x 4K: a re-plan every fourth step, 0.6-1.2 ms on the device's host, showed
            # between steps of 1.0 ms while prompt lookup accepted all 16 drafts)
            self._next = (self.current, "every draft accepted at the largest K")
            return
        if not self._memo:  # the first step, or estimates cleared by `next_step` without a `prepare`: all anew
            self._absorb()
            self._refreshed = dict.fromkeys((K0, *self.members), self.step)
            self._urgent = []
            for name in self._refreshed:
                self._estimate(name)
        else:
            # one drafter's estimate renewed per step (a step's planning stays short: at 32 rows one drafter's
            # estimate takes 0.1-0.2 ms on this project's CPU, 2-3x that on a GPU machine's host, as much as the
            # verify it must hide behind): one an outcome made urgent (its trial, its first runs, its proposals all
            # accepted), else the current drafter's or the oldest one past `_REPLAN_EVERY` steps; the plain step's
            # (a median) besides
            due = [n for n, at in self._refreshed.items() if self.step - at >= _REPLAN_EVERY]
            if K0 in due:
                self._renew(K0)
            name = None
            if (self._urgent or due) and self._budget_allows():
                if self._urgent:
                    name = self._urgent.pop(0)
                else:
                    name = self.current[0] if self.current[0] in due else min(due, key=self._refreshed.__getitem__)
            elif self.current[0] in self._urgent and self.step - self._renewed_step >= _REPLAN_EVERY:
                # the drafter now running turned (its rows' hits flipped, or its steps fell far short of its
                # estimate: `_surprised`): its estimate is renewed every `_REPLAN_EVERY` steps at most, whatever the
                # share (one H100, run25, 4 x 16K: prompt lookup kept K = 16 for 30 steps whose one remaining row
                # accepted nothing, 0.92 ms each against 0.65 at K = 3, its estimate held back by the 5% share)
                name = self.current[0]
                self._urgent.remove(name)
            if name is not None and name != K0:
                begin = time.perf_counter()
                self._renew(name)
                spent = time.perf_counter() - begin
                self._renew_s = spent if self._renew_s is None else 0.7 * self._renew_s + 0.3 * spent
                self._renewed_step = self.step
        reason = self.last_reason
        choice = self._choose(self.most_remaining())
        if self._filled is not None and choice[0] == self._filled[0] and self.trial is None and self._climb_pays():
            # every active row accepted all K drafts of the last step, and the drafter goes on: K climbs by half
            # now rather than at the next estimate (one H100, 1 x 16K random tokens: K went 2 -> 4 -> 16 four steps
            # apart with every draft accepted, the estimates being kept `_REPLAN_EVERY` steps)
            name, k = self._filled
            if self.current[0] == name:  # the step now verifying was chosen after it: climb from there
                k = max(k, self.current[1])
            choice = (name, max(choice[1], min(self.max_k, k + max(1, k // 2))))
        self._next = (choice, self.last_reason)
        self.last_reason = reason  # `state` reports the step that ran
        self._estimates = {K0: self.utility(K0, 0)}
        for name in self.members:
            k, u = self._memo.get(("b", name), (None, None))
            tokens = self._memo.get(("crit", name))
            self._estimates[name] = (
                None if u is None else (k, u, None if tokens is None else float(tokens[k]))
            )

    def _budget_allows(self) -> bool:
        """Whether a renewal (urgent or due) fits ``plan_share`` of the steps since the last renewal: the host's
        planning must hide behind the device's steps, and a renewal can take as long as a short step (one H200 in
        a slow-host run, 1 x 1024 tokens: 0.25-0.65 ms of planning per step against 0.4 ms verifies, and `auto`
        ran 0.64x prompt lookup with the same choices)."""
        if self.plan_share is None or self._renew_s is None:
            return True
        member, k = self.current
        step_s = self._cost(member or K0, k if member else 0) or self._cost(K0, 0)
        if not step_s:
            return True
        return (self.step - self._renewed_step) * step_s * self.plan_share >= self._renew_s

    def _climb_pays(self) -> bool:
        """Whether K climbs by half after a step where every row accepted every draft (see `prepare`): always for a
        drafter whose drafting costs the same at any K; for one whose drafting grows with K, where its last estimate
        values the climbed K at least as much as the K it ran (one H200, 1 x 16K: Vegas climbed 7 -> 10 -> 15 on
        full acceptances and spent 3.6-4.4 ms on steps that kept 0-6 of 13-16 drafts, against 2.3 ms at K = 7)."""
        name, k = self._filled
        if not self.members[name].draft_grows_with_k:
            return True
        values = self._memo.get(("u", name))
        if values is None:
            return True
        k = max(k, self.current[1]) if self.current[0] == name else k
        climbed = min(self.max_k, k + max(1, k // 2))
        return bool(np.isfinite(values[climbed]) and values[climbed] >= values[k])

    def _renew(self, name: str) -> None:
        """Drops ``name``'s estimates (a drafter's, or the plain step's) and makes them anew."""
        self._absorb()
        self._memo = {key: v for key, v in self._memo.items() if key == "rows" or key[1] != name}
        self._refreshed[name] = self.step
        self._estimate(name)

    def _stale(self, urgent: str | None = None) -> None:
        """Marks every estimate due for renewal (one per step, `prepare`), ``urgent`` first."""
        self._refreshed = dict.fromkeys(self._refreshed, self.step - _REPLAN_EVERY)
        if urgent is not None:
            self._make_urgent(urgent)

    def _make_urgent(self, name: str) -> None:
        """``name``'s estimates are renewed by the next `prepare`, before any that are merely due."""
        if name != K0 and name not in self._urgent:
            self._urgent.append(name)

    def _estimate(self, name: str) -> None:
        """Fills the estimates the next choice reads of drafter ``name`` (or of the plain step, ``K0``)."""
        plain = self.utility(K0, 0)
        if name == K0:
            return
        if self._has_runs(name):
            self.best_k(name)
        elif plain is not None and self.profile.known(name):
            self._first_trial_k(name, plain, self.max_k + 1)  # its prior utilities

    def most_remaining(self) -> int:
        """The most tokens an active row may still generate, as of the last outcome taken in."""
        rows = [r for r, a in zip(self.remaining_rows, self.active or [True] * len(self.remaining_rows)) if a]
        return max(rows) if rows else self._remaining

    def observe(self, outcome: StepOutcome) -> None:
        """Keeps the outcome; it is taken in by the next `prepare` (while the device verifies) or `next_step`: the
        host does no planning between the readback and the next step's launch."""
        self._pending.append(outcome)

    def _take_in(self, kept: bool) -> None:
        """Takes in the outcomes observed since the last call; ``kept``: estimates may be kept across them (see
        `prepare`), else they are cleared."""
        while self._pending:
            self._take(self._pending.popleft(), kept)
        if not kept:
            self._absorb()

    def finish(self) -> None:
        """The call ended: its last outcomes go into the runs and the cost profile (kept for later calls)."""
        self._take_in(kept=True)
        self._absorb()

    def _absorb(self) -> None:
        """Writes the outcomes taken in since the last estimate into the runs and the cost profile: in one burst
        right before an estimate reads them, not one per step (after a step's device work the host's caches are
        cold: one outcome's writes took 75-150 us in a call on this project's CPU against 6 us back to back, and
        the fixtures' steps are host-bound)."""
        for member, k, parts, switched, shadow, ran, issued, accepted in self._unabsorbed:
            if parts is not None:
                if switched:
                    usual = self.profile.draft_s(member, k)  # before this step's own measurement
                    if usual is not None:
                        # the catch-up goes to the switch's price, not to K's drafting: one H100, 32 x 8K, a draft
                        # model's first step after 21 prompt lookup steps drafted 6 tokens in 6.97 ms against 2.0
                        self.profile.add_switch(member, parts[0] - usual)
                        parts = (math.nan, *parts[1:])
                self.profile.add(member, k, *parts)
            for name, rows, issued_, accepted_ in shadow:
                self.state_of[name].runs.add_rows(rows, issued_, accepted_)
                self.profile.add_runs(name, sum(accepted_), sum(a < i for i, a in zip(issued_, accepted_)))
            if ran is not None:
                self.state_of[member].runs.add_rows(ran, [issued] * len(ran), accepted)
                self.profile.add_runs(member, sum(accepted), sum(a < issued for a in accepted))
        self._unabsorbed.clear()

    def _take(self, outcome: StepOutcome, kept: bool) -> None:
        """Takes in one outcome: what the next choice needs at once (trial, rows that finished, whether every draft
        was accepted, a turn of the text), the rest kept for `_absorb`."""
        member = outcome.extra.get("member") or K0
        finished = (
            "active" in outcome.extra and list(outcome.extra["active"]) != self.active and bool(self.active)
        )
        if not kept:  # estimates change with every observation: none are kept
            self._memo.clear()
        elif finished:  # the rows that vouch for a drafter changed: every estimate is renewed, one per step
            self._memo = {key: v for key, v in self._memo.items() if key != "rows" and key[0] != "has"}
            self._stale()
        if kept and self.trial is not None and self.trial.member == member:
            self._stale(member)  # a trial's outcome decides whether it goes on: its estimate first
        elif kept and self._memo.get(("has", member)) is False:  # a drafter's first runs
            self._memo.pop(("has", member))
            self._stale(member)
        parts = outcome.extra.get("parts")
        issued = outcome.extra.get("issued", outcome.k)
        if issued == 0:
            member = K0
        switched = member != K0 and member != self._last_ran and self.state_of[member].steps > 0
        self._last_ran = member
        shadow = []
        for name, row_steps in outcome.extra.get("shadow", {}).items():
            shadowed = self.state_of[name]
            # (row, `Step`): a proposal scored against the row's continuation
            issued_, accepted_ = (
                [step.issued for _, step in row_steps],
                [step.accepted[0] for _, step in row_steps],
            )
            shadow.append((name, [row for row, _ in row_steps], issued_, accepted_))
            if name != member and accepted_ and all(0 < a == i for i, a in zip(issued_, accepted_)):
                # every row would have taken all of another drafter's proposals: choose again now rather than keep
                # this step's choice `_REPLAN_EVERY` steps (one H200, 1 x 16K random tokens: four Vegas steps at
                # 3.6 ms of drafting each while prompt lookup's scored proposals were all accepted)
                if kept:
                    self._stale(name)
                else:
                    self._memo.clear()
            shadowed.steps += 1  # new evidence: its K is scanned again
            shadowed.shadowed = True
        if "active" in outcome.extra:
            self.active = list(outcome.extra["active"])
        if "remaining" in outcome.extra:
            self.remaining_rows = list(outcome.extra["remaining"])
        if member == K0:
            self._filled = None
            self._unabsorbed.append((member, outcome.k, parts, False, shadow, None, 0, None))
            return
        state = self.state_of[member]
        rows = outcome.extra.get("rows")
        if rows is None:  # the accepted counts of the active rows, in row order
            rows = list(outcome.accepted)
        ran = [row for row, accepted in enumerate(rows) if accepted is not None]
        accepted = [rows[row] for row in ran]
        self._unabsorbed.append((member, outcome.k, parts, switched, shadow, ran, issued, accepted))
        self._filled = (member, issued) if ran and all(a >= issued for a in accepted) else None
        state.short.append(outcome.k if outcome.k < issued else None)
        if ran:
            hits = sum(a > 0 for a in accepted) / len(ran)
            if kept and state.hits is not None and abs(hits - state.hits) >= 0.5:
                # the text turned (most rows hit where most missed, or the reverse): its estimate is renewed now,
                # not up to `_REPLAN_EVERY` steps later (one H200, 1 x 16K: prompt lookup kept K = 15 for 8 steps
                # that all missed after a hit, its estimate of 8 tokens per step kept meanwhile)
                self._make_urgent(member)
            state.hits = hits
            if kept and self._surprised(state, issued, accepted):
                self._make_urgent(member)
        state.last_step = outcome.index
        state.steps += 1
        if self.trial is not None and self.trial.member == member:
            self.trial.observed += 1

    def _surprised(self, state: _MemberState, issued: int, accepted: list[int]) -> bool:
        """Whether a drafter's estimate is wrong enough to renew: its rows' mean tokens (accepted + 1) fell short of
        the estimate at that K (its rows' mean) by a factor of `_SURPRISE` or more, `_SURPRISES` of its steps in a row
        (the dear way to be wrong: wide verifies of rejected drafts; an estimate that undersells a drafter is renewed
        in its turn).
        One miss after a copy streak barely moves a row's estimate; the misses that follow are no turn of the text,
        and without this the estimate could stand until the planning share allowed a renewal (one H100, run25,
        4 x 16K: prompt lookup kept K = 16 for 30 steps whose one remaining row accepted nothing)."""
        if state.tokens is None or not accepted:
            return False
        per_row = state.tokens[1][0]  # [R, K + 1]: each active row's expected tokens, as of the last estimate
        if issued >= per_row.shape[1]:
            return False
        expected = float(per_row[:, issued].mean())
        realized = 1.0 + sum(accepted) / len(accepted)
        state.surprises = state.surprises + 1 if expected >= _SURPRISE * realized else 0
        if state.surprises >= _SURPRISES:
            state.surprises = 0
            return True
        return False

    # ------------------------------------------------------------------------------------------------ estimates
    def utility(self, member: str, k: int) -> float | None:
        """Tokens per row per second of ``member`` at K (a plain step at K = 0); None when not estimable."""
        if k == 0:
            cost = self._cost(K0, 0)
            return None if not cost else 1.0 / cost
        values = self._utilities(member)
        if values is None or not np.isfinite(values[k]):
            return None
        return float(values[k])

    def _cost(self, member: str, k: int) -> float | None:
        key = ("c", member, k)
        if key not in self._memo:
            self._memo[key] = self.profile.cost(member, k)
        return self._memo[key]

    def _active_rows(self) -> list[int]:
        rows = self._memo.get("rows")
        if rows is None:
            rows = self._memo["rows"] = (
                [r for r, a in enumerate(self.active) if a] if self.active else list(range(self.batch))
            )
        return rows

    def _has_runs(self, member: str) -> bool:
        key = ("has", member)
        if key not in self._memo:
            self._absorb()
            rows = self._active_rows()
            self._memo[key] = bool(rows) and self.state_of[member].runs.any(rows)
        return self._memo[key]

    def _critical_tokens(self, member: str) -> np.ndarray | None:
        """Tokens per step at K = 0 .. max_k by which the call's end comes nearer (`batch_pace`: the row expected to
        finish last, its own rate and the luck of the rest counted); None without runs of active rows."""
        key = ("crit", member)
        if key in self._memo:
            return self._memo[key]
        self._absorb()
        state = self.state_of[member]
        rows = self._active_rows()
        tokens = None
        if self._has_runs(member):
            cache_key = (state.steps, tuple(rows))
            if state.tokens is None or state.tokens[0] != cache_key:
                state.tokens = (cache_key, state.runs.expected_tokens(rows, self.max_k))
            per_row, weight = state.tokens[1]
            if len(self.remaining_rows) > max(rows):
                remaining = np.array(self.remaining_rows, dtype=np.float64)[rows]
            else:
                remaining = np.full(len(rows), float(self._remaining))
            tokens = batch_pace(per_row, weight, remaining)
        self._memo[key] = tokens
        return tokens

    def _utilities(self, member: str) -> np.ndarray | None:
        """`utility` of ``member`` at every K (index K; NaN where not estimable), once per step."""
        key = ("u", member)
        if key in self._memo:
            return self._memo[key]
        tokens = self._critical_tokens(member)
        costs = self.profile.costs(member, self.max_k) if tokens is not None else None
        values = None
        if costs is not None:
            ran = list(self.state_of[member].short)
            short = [r for r in ran if r is not None]
            if short:  # steps where the drafter had fewer drafts than issued ran a smaller K: priced at what they ran
                ks = np.arange(self.max_k + 1)
                shorter = sum(costs[np.minimum(r, ks)] for r in short)
                costs = (shorter + costs * (len(ran) - len(short))) / len(ran)
            with np.errstate(divide="ignore", invalid="ignore"):
                values = np.where(costs > 0, tokens / costs, np.nan)
        self._memo[key] = values
        return values

    def best_k(self, member: str) -> tuple[int, float | None]:
        """The K of highest utility for ``member`` (up to 1.5 times the largest K of its current evidence) and that
        utility."""
        key = ("b", member)
        if key in self._memo:
            return self._memo[key]
        self._absorb()
        state = self.state_of[member]
        ran = state.runs.largest_k(self._active_rows())
        top = min(self.max_k, max(ran, 1) + max(1, ran // 2))
        if not self.members[member].draft_grows_with_k:
            top = self.max_k  # a search costs the same at any K: only the verify's width holds K back
        # every K up to the top (the utilities of all Ks are one vector: scanning them costs nothing, and K may fall
        # as far as the estimate says at once: one H200, 4 x 16K, prompt lookup stayed at K = 13-16 for 40 steps
        # while a scan from 2 below the last best could lower it by 2 per estimate, and K = 4 ran 1.3x faster)
        ks = range(1, top + 1)
        best = (self.members[member].start_k, None)
        values = self._utilities(member)
        if values is not None:
            ks = np.asarray(ks)
            scanned = np.where(np.isfinite(values[ks]), values[ks], -np.inf)
            i = int(scanned.argmax())
            if np.isfinite(scanned[i]):
                best = (int(ks[i]), float(scanned[i]))
        self._memo[key] = best
        return best

    # ------------------------------------------------------------------------------------------------ choice
    def next_k(self) -> int:
        return self.next_step(remaining=self.max_k + 1)[1]

    def next_step(self, remaining: int) -> tuple[str | None, int]:
        """``(drafter or None, K)`` for the next step; ``remaining``: the most tokens a row still needs. The choice
        `prepare` made, else one made now from every outcome observed."""
        if self._next is not None:
            choice, self.last_reason = self._next
            self._next = None
        else:
            self._take_in(kept=False)
            choice = self._choose(remaining)
        self.current = choice
        self._remaining = remaining
        self.step += 1
        return choice

    def _choose(self, remaining: int) -> tuple[str | None, int]:
        if self.baseline_left > 0:
            self.baseline_left -= 1
            self.last_reason = "baseline"
            return None, 0
        plain = self.utility(K0, 0)
        ranked = self._ranked()
        best_name, best_k, best_u = ranked[0] if ranked else (None, 0, plain)
        if plain is not None and (best_u is None or best_u <= plain):
            best_name, best_k, best_u = None, 0, plain
        # the running trial goes on while it may still win
        if self.trial is not None:
            trial = self.trial
            u = self.utility(trial.member, trial.k) if trial.observed else None
            losing = (
                u is not None
                and best_u is not None
                and best_name != trial.member
                and u < self.give_up * best_u
            )
            if trial.steps_left > 0 and not losing:
                trial.steps_left -= 1
                self.last_reason = f"trial {trial.member}"
                return trial.member, trial.k
            self._end_trial(won=best_name == trial.member)
        due = self._due(remaining, plain, best_u)
        if due:
            name = max(due, key=lambda n: self.best_k(n)[1] or float("inf"))
            k = self.best_k(name)[0] if self._has_runs(name) else self._first_k[name]
            self.trial = _Trial(name, k, self.trial_steps - 1)
            self.last_reason = f"trial {name}"
            return name, k
        # stay with the current drafter unless another beats it by the margin, its switch cost counted
        current, _ = self.current
        if current is not None and current != best_name and best_u is not None:
            k, u = self.best_k(current)
            if (
                u is not None
                and u * (1 + self.switch_margin) >= self._after_switch(best_name, best_k, best_u)
                and (plain is None or u > plain)
            ):
                best_name, best_k = current, k
            elif best_name is None and self.exploiting == current:
                # the text turned against the drafter that was best: the others get their next trial soon
                for name, state in self.state_of.items():
                    if name != current:
                        state.backoff = min(state.backoff, self.first_backoff)
        self.last_reason = "best" if best_name is not None else "plain is fastest"
        self.exploiting = best_name
        return best_name, best_k

    def _after_switch(self, name: str | None, k: int, utility: float) -> float:
        """``utility`` of ``name`` at K with its switch cost (`CostProfile.switch_s`) spread over `_SWITCH_HORIZON`
        steps (a plain step, or a drafter with no measured switch cost: unchanged)."""
        extra = self.profile.switch_s(name) if name is not None else 0.0
        cost = self._cost(name, k) if name is not None and extra > 0 else None
        if not cost:
            return utility
        return utility * cost * _SWITCH_HORIZON / (cost * _SWITCH_HORIZON + extra)

    def _first_trial_k(self, name: str, bar: float | None, remaining: int) -> int | None:
        """K of a drafter's first trial in this call: where the profile prices it, the K (up to its start K) of best
        utility under a good prior acceptance (each draft accepted with the probability
        `CostProfile.prior_acceptance` gives: the best of the profile's recent calls), or None
        when even that cannot beat ``bar``, the best utility so far (a plain step's, or a drafter's that runs well:
        a verify of K + 1 tokens can cost several plain steps on a CPU or at a large batch, and a trial against
        a drafter emitting a dozen tokens per step costs more than it can find); unpriced, its start K."""
        member = self.members[name]
        if bar is None or not self.profile.known(name):
            return member.start_k
        key = ("prior", name)
        if key not in self._memo:  # utilities at K = 1 .. start K under the prior (None: not all priced)
            top = min(member.start_k, self.max_k)
            costs = self.profile.costs(name, self.max_k)
            priced = costs is not None and np.isfinite(costs[1 : top + 1]).all()
            tokens = np.cumsum(self.profile.prior_acceptance(name) ** np.arange(top + 1))[1:]
            self._memo[key] = tokens / costs[1 : top + 1] if priced else None
        utilities = self._memo[key]
        if utilities is None:
            return member.start_k
        utilities = utilities[: max(1, min(len(utilities), remaining - 1))]  # K climbs from evidence later
        k = int(utilities.argmax())
        return k + 1 if utilities[k] > bar else None

    def _ranked(self) -> list[tuple[str, int, float | None]]:
        out = []
        for name in self.members:
            if not self._has_runs(name):
                continue
            k, u = self.best_k(name)
            if u is not None:
                out.append((name, k, u))
        return sorted(out, key=lambda r: -r[2])

    def _due(self, remaining: int, plain: float | None, best_u: float | None) -> list[str]:
        due = []
        for name, member in self.members.items():
            state = self.state_of[name]
            if state.last_step is not None and self.step - state.last_step < state.backoff:
                continue
            if (
                state.last_step is None
                and member.warm_share > 0
                and not self._warm_pays(member, remaining, best_u or plain)
            ):
                continue
            if self.current[0] == name:
                continue
            if state.shadowed and self.profile.known(name):
                continue  # scored every step and priced: its estimate is live without a trial
            if not self._has_runs(name):
                k = self._first_trial_k(name, best_u, remaining)
                if (
                    k is None
                ):  # priced, and it cannot pay now even at a good acceptance: asked again next step
                    continue
                self._first_k[name] = k
            due.append(name)
        return due

    def _warm_pays(self, member: Member, remaining: int, rate: float | None) -> bool:
        """A drafter's one-off start cost (its own prefill) is under ``warm_share`` of the decoding ahead at
        ``rate``, the best utility so far (tokens per row per second)."""
        if self.prefill_s is None or rate is None:
            return True
        ahead_s = remaining / rate
        return member.warm_share * self.prefill_s <= self.warm_share * ahead_s

    def _end_trial(self, won: bool) -> None:
        state = self.state_of[self.trial.member]
        state.backoff = self.first_backoff if won else min(4096, state.backoff * 2)
        self.trial = None

    # ------------------------------------------------------------------------------------------------ reports
    def state(self) -> dict:
        """The step that ran (``member``, ``k``, ``reason``) and, once `prepare` ran, ``estimates``: what it saw for
        the next choice, per drafter ``(K, utility, critical row's tokens per step)`` at its best K (None when
        not estimable), and the plain step's utility under ``k0`` (tokens per row per second)."""
        member, k = self.current
        report = {"member": member or K0, "k": k, "reason": self.last_reason}
        if self._estimates:
            report["estimates"] = self._estimates
        return report
