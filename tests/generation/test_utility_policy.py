"""Deterministic simulations of the utility (Cascade) K policy: synthetic step costs and acceptance traces."""

from __future__ import annotations

import doctest
import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hf_sparse_verify.config import SpeculationConfig
from hf_sparse_verify.generation.policies import utility_policy
from hf_sparse_verify.generation.policies.k_policy import ConstantKPolicy, StepOutcome, make_k_policy
from hf_sparse_verify.generation.policies.utility_policy import UtilityKPolicy, plan_next_trial

StepTime = Callable[[int, int], float]  # (K, step index) -> seconds
Accepted = Callable[[int, int], "int | list[int]"]  # (K, step index) -> accepted drafts (one int per row)


@dataclass
class Run:
    ks: list[int]
    states: list[dict]
    time: float  # total simulated time
    tokens: float  # total tokens per row

    @property
    def phases(self) -> list[str]:
        return [state["phase"] for state in self.states]

    def segments(self) -> list[tuple[str, int, int]]:
        """``(phase, K, length)`` of each run of consecutive steps with the same phase and K."""
        runs: list[list] = []
        for phase, k in zip(self.phases, self.ks):
            if runs and runs[-1][0] == phase and runs[-1][1] == k:
                runs[-1][2] += 1
            else:
                runs.append([phase, k, 1])
        return [tuple(run) for run in runs]

    def test_starts(self) -> list[int]:
        phases = self.phases
        return [
            i for i, phase in enumerate(phases) if phase == "test" and (i == 0 or phases[i - 1] != "test")
        ]

    def first_test(self) -> list[int]:
        """K of each step of the first test phase."""
        start = self.test_starts()[0]
        end = start
        while self.phases[end] == "test":
            end += 1
        return self.ks[start:end]


def simulate(
    policy: UtilityKPolicy,
    step_time: StepTime,
    accepted: Accepted,
    steps: int,
    lag: int = 0,
    drop_time: Callable[[int], bool] = lambda i: False,
) -> Run:
    """Drive ``next_k``/``observe`` for ``steps`` steps; outcomes reach the policy ``lag`` steps late."""
    ks, states, queue = [], [], []
    total_time = tokens = 0.0
    for i in range(steps):
        k = policy.next_k()
        assert 0 <= k <= policy.max_k
        rows = accepted(k, i)
        rows = [rows] if isinstance(rows, int) else rows
        seconds = step_time(k, i)
        total_time += seconds
        tokens += 1 + sum(rows) / len(rows)
        queue.append(StepOutcome(index=i, k=k, accepted=rows, time_s=None if drop_time(i) else seconds))
        if len(queue) > lag:
            policy.observe(queue.pop(0))
        ks.append(k)
        states.append(policy.state())
    for outcome in queue:
        policy.observe(outcome)
    return Run(ks, states, total_time, tokens)


def table_curve(utilities: dict[int, float]) -> tuple[StepTime, Accepted]:
    """Step costs that give exactly ``utilities[K]``: every draft is accepted, step time (K + 1) / utility."""

    def step_time(k: int, i: int) -> float:
        return 1.0 if k == 0 else (k + 1) / utilities[k]

    return step_time, lambda k, i: k


def never_accept(k: int, i: int) -> int:
    return 0


# --------------------------------------------------------------------------------- switch-off and slowdown bound
ADVERSARIAL = {
    # name: (step time, K of each step of the first test phase); drafts are never accepted
    # below 1 the test phase walks down to K = 1 before switching off (the switch-off rule)
    "flat_2x": (
        lambda k, i: 1.0 if k == 0 else 2.0,
        [3] * 4 + [2] * 4 + [1] * 4,
    ),  # the paper's example (5.5)
    "flat_3x": (
        lambda k, i: 1.0 if k == 0 else 3.0,
        [3] * 4 + [2] * 4 + [1] * 4,
    ),  # "up to 3x the cost" (5.5)
    "linear": (lambda k, i: 1.0 + 0.5 * k, [3] * 4 + [2] * 4 + [1] * 4),  # 2.5x at K = 3
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_switches_off_and_slowdown_within_paper_bound(name):
    step_time, first_test = ADVERSARIAL[name]
    run = simulate(UtilityKPolicy(max_k=16), step_time, never_accept, steps=2000)
    slowdown = run.time / run.tokens / step_time(0, 0) - 1
    print(f"{name}: slowdown {slowdown:.2%} over 2000 steps")
    assert run.ks[:4] == [0] * 4
    assert run.first_test() == first_test
    segments = run.segments()
    assert all(k == 0 for phase, k, _ in segments if phase == "set")
    # after a set phase at K = 0 every test phase is one trial at K = 1 (K = 1 below 1 ends it)
    later_tests = [(k, n) for phase, k, n in segments if phase == "test"][len(first_test) // 4 :]
    assert later_tests and all(trial == (1, 4) for trial in later_tests)
    assert 0 < slowdown <= 0.05


def test_paper_adversarial_example_numbers():
    """2x cost, ETR 1, t = 4, S = 16 with back-off: speculative steps over 250 and 2000 steps."""
    step_time = ADVERSARIAL["flat_2x"][0]
    short = simulate(UtilityKPolicy(max_k=16), step_time, never_accept, steps=250)
    long = simulate(UtilityKPolicy(max_k=16), step_time, never_accept, steps=2000)
    # paper: "only 18 iterations [over 250] compared to nearly 50 without back-off"; ours: 12 + 2.5 * 4
    assert sum(k > 0 for k in short.ks) == 22
    assert sum(k > 0 for k in long.ks) == 32
    assert long.time / long.tokens - 1 == pytest.approx(32 / 2000)


# ------------------------------------------------------------------------------------------- hill climbing
def peaked(peak: int, decay: float = 0.8, max_k: int = 16) -> dict[int, float]:
    return {k: 2.0 * decay ** abs(k - peak) for k in range(1, max_k + 1)}


UNIMODAL = {
    **{f"peak_{p}": peaked(p) for p in range(1, 7)},
    "asymmetric_peak_4": {1: 1.2, 2: 1.5, 3: 1.9, 4: 2.2, 5: 1.5, 6: 1.0, 7: 0.8, 8: 0.6},
    "steep_left_peak_2": {1: 1.3, 2: 2.5, 3: 2.1, 4: 1.7, 5: 1.4, 6: 1.2, 7: 1.0, 8: 0.9},
    "below_one_then_peak_1": {1: 1.6, 2: 1.2, 3: 0.9, 4: 0.7, 5: 0.6, 6: 0.5, 7: 0.4, 8: 0.3},
}


@pytest.mark.parametrize("name", sorted(UNIMODAL))
def test_finds_best_static_k_in_one_test_phase(name):
    utilities = UNIMODAL[name]
    best_static = max(utilities, key=utilities.get)
    policy = UtilityKPolicy(max_k=max(utilities))
    run = simulate(policy, *table_curve(utilities), steps=400)
    first_test = run.first_test()
    assert len(first_test) <= policy.max_trials * policy.trial_steps
    sets = [(k, n) for phase, k, n in run.segments() if phase == "set"]
    assert sets[0][0] == best_static  # the first set phase already runs the best static K
    assert all(k == best_static for k, _ in sets)
    assert run.states[len(first_test) + 4]["best_k"] == best_static
    # throughput against running the best static K from the first step (tests and baseline refreshes cost a bit)
    assert run.tokens / run.time >= 0.85 * utilities[best_static]


def geometric_curve(alpha: float, cost: float, max_k: int = 16) -> dict[int, float]:
    """Utility with per-token acceptance rate ``alpha`` and verification cost ``cost`` per draft token."""
    return {k: (1 - alpha ** (k + 1)) / (1 - alpha) / (1 + cost * k) for k in range(1, max_k + 1)}


@pytest.mark.parametrize("alpha, cost", [(0.9, 0.3), (0.8, 0.1), (0.6, 0.15)])
def test_flat_curves_stop_within_tolerance_of_the_best(alpha, cost):
    """Near the peak these curves are flat, so the converged exit may stop short of it, but within the 10%
    tolerance of the best utility, in the first test phase."""
    utilities = geometric_curve(alpha, cost)
    run = simulate(UtilityKPolicy(max_k=16), *table_curve(utilities), steps=100)
    set_k = next(k for phase, k, _ in run.segments() if phase == "set")
    assert utilities[set_k] >= (1 - 0.10) * max(utilities.values())


def test_far_peak_is_reached_over_successive_test_phases():
    """Utility rises up to K = 16 here: one test phase climbs 3 -> 6 (the next K is within 10%: converged); the set
    phase at 6 accepts every draft, so after t steps it is cut and becomes the first trial of a test that jumps
    to 12 (saturation), and so on until K_max (climbing one K per test phase took 11 test phases)."""
    run = simulate(UtilityKPolicy(max_k=16), *table_curve(geometric_curve(0.95, 0.05)), steps=600)
    set_ks = [run.ks[i] for i in _set_starts(run) if run.phases[i - 1] == "test"]
    assert run.first_test() == [3] * 4 + [4] * 4 + [5] * 4 + [6] * 4
    assert set_ks[0] == 6 and set_ks[:3] == sorted(set_ks[:3])
    assert run.ks.index(16) < 40
    assert set(set_ks[2:]) == {16}


# ------------------------------------------------------------------------------------------------ back-off
def test_backoff_doubles_set_phase_while_speculation_never_pays():
    run = simulate(UtilityKPolicy(max_k=16), lambda k, i: 1.0 + 0.5 * k, never_accept, steps=4000)
    sets = [(k, n) for phase, k, n in run.segments() if phase == "set"]
    assert sets[:-1] == [(0, 32 * 2**i) for i in range(6)]
    starts = run.test_starts()
    assert starts == [4, 48, 116, 248, 508, 1024, 2052]
    set_gaps = [b - a - 4 for a, b in zip(starts[1:], starts[2:])]  # K = 0 steps between one-trial tests
    assert all(later == 2 * earlier for earlier, later in zip(set_gaps, set_gaps[1:]))
    assert [run.states[start]["set_steps"] for start in starts[1:]] == [32 * 2**i for i in range(6)]


def test_backoff_resets_when_speculation_pays_again():
    good = range(300, 700)  # drafts are right and cheap here, worthless elsewhere

    def step_time(k: int, i: int) -> float:
        return 1.0 + (0.2 if i in good else 0.5) * k

    def accepted(k: int, i: int) -> int:
        return k if i in good else 0

    run = simulate(UtilityKPolicy(max_k=16), step_time, accepted, steps=1200)
    sets = [(run.ks[start], run.states[start]["set_steps"]) for start in _set_starts(run)]
    assert sets[:3] == [(0, 32), (0, 64), (0, 128)]
    speculating = [s for s in sets if s[0] > 0]
    assert speculating and all(s[1] == 16 for s in speculating)
    after_good = [s for start, s in zip(_set_starts(run), sets) if start > 720]
    assert after_good[0] == (0, 32)  # back-off starts again from the configured S


def _set_starts(run: Run) -> list[int]:
    phases = run.phases
    return [i for i, phase in enumerate(phases) if phase == "set" and phases[i - 1] != "set"]


# ----------------------------------------------------------------------------------------------- early exits
def test_exit_when_utility_falls_in_successive_trials():
    utilities = {1: 1.0, 2: 1.1, 3: 1.5, 4: 1.3, 5: 1.2}  # 3 -> 4 fell 13%, back to 2: fell again 15%
    run = simulate(UtilityKPolicy(max_k=5), *table_curve(utilities), steps=40)
    assert run.first_test() == [3] * 4 + [4] * 4 + [2] * 4
    assert run.ks[16:32] == [3] * 16
    assert run.states[16]["exit"] == "falling"
    assert run.states[16]["best_k"] == 3


@pytest.mark.parametrize(
    "utilities, trials, set_k, set_steps",
    [
        ({1: 1.5, 2: 1.2, 3: 0.9}, [3, 2, 1], 1, 16),  # climbing down with rising utility reaches K = 0
        ({1: 0.75, 2: 0.6, 3: 0.5}, [3, 2, 1], 0, 32),  # switch-off: K = 1 below 1
    ],
)
def test_exit_when_k_reaches_zero(utilities, trials, set_k, set_steps):
    run = simulate(UtilityKPolicy(max_k=3), *table_curve(utilities), steps=40)
    assert run.first_test() == [k for k in trials for _ in range(4)]
    end = 4 + 4 * len(trials)
    assert run.states[end]["exit"] == "k_zero"
    assert run.states[end]["phase"] == "set"
    assert run.ks[end : end + 16] == [set_k] * 16
    assert run.states[end]["set_steps"] == set_steps


@pytest.mark.parametrize(
    "tolerance, trials, set_k, exit_reason",
    [(0.10, [3, 4], 4, "converged"), (0.05, [3, 4, 5, 6], 5, "max_trials")],
)
def test_exit_when_successive_utilities_within_tolerance(tolerance, trials, set_k, exit_reason):
    utilities = {1: 1.0, 2: 1.2, 3: 1.5, 4: 1.6, 5: 1.9, 6: 1.5}  # 3 -> 4 differs by 6.7%
    run = simulate(UtilityKPolicy(max_k=6, tolerance=tolerance), *table_curve(utilities), steps=50)
    assert run.first_test() == [k for k in trials for _ in range(4)]
    end = 4 + 4 * len(trials)
    assert run.states[end]["exit"] == exit_reason
    # (at 4 every draft is accepted and K = 5 is untried: the set phase is cut after 2 steps to test above it)
    assert run.ks[end : end + 2] == [set_k] * 2


def test_plan_next_trial_exit_order():
    plan = plan_next_trial
    assert plan([(3, 1.5), (4, 1.3), (2, 1.1)], 8, 4, 0.1) == (None, "falling")
    assert plan([(3, 1.5), (4, 1.55)], 8, 4, 0.1) == (None, "converged")
    assert plan([(3, 1.5), (4, 2.0), (5, 1.5)], 8, 4, 0.1) == (None, "peak")
    assert plan([(7, 1.5), (8, 2.0)], 8, 4, 0.1) == (None, "k_max")
    assert plan([(8, 1.5)], 8, 4, 0.1) == (7, "climb")
    assert plan([(3, 0.5)], 8, 4, 0.1) == (2, "climb")
    assert plan([(3, 1.2), (4, 0.9)], 8, 4, 0.1) == (2, "climb")
    assert plan([(1, 0.99)], 8, 4, 0.1) == (None, "k_zero")
    assert plan([(3, 0.9), (2, 0.8), (1, 0.7)], 8, 4, 0.1) == (None, "k_zero")  # switch-off before "falling"
    assert plan([(3, 1.2), (4, 1.5), (5, 1.9), (6, 2.5)], 8, 4, 0.1) == (None, "max_trials")


# ------------------------------------------------------------------------------------- utility and baseline
def test_batch_utility_is_mean_etr_over_rows():
    # two rows: one accepts every draft, the other none -> ETR = 1 + K / 2; steps cost the same at every K
    run = simulate(UtilityKPolicy(max_k=8), lambda k, i: 1.0, lambda k, i: [k, 0], steps=9)
    assert run.states[8]["utility"] == pytest.approx(1 + 3 / 2)


def test_baseline_is_median_of_plain_steps():
    # the first plain step is a 10x warm-up outlier; K = 3 steps cost 2 units and accept 3 drafts -> utility 2
    run = simulate(
        UtilityKPolicy(max_k=8),
        lambda k, i: 10.0 if i == 0 else (1.0 if k == 0 else 2.0),
        lambda k, i: k,
        steps=9,
    )
    assert run.states[8]["utility"] == pytest.approx(4 / 2)


def _plain_runs(run: Run) -> list[int]:
    return [i for i in range(1, len(run.ks)) if run.ks[i] == 0 and run.ks[i - 1] != 0]


def test_baseline_refreshed_while_speculating():
    """Speculation barely pays (best utility 1.05): the K = 0 step time decides it, and is refreshed every
    `baseline_refresh` steps."""
    policy = UtilityKPolicy(max_k=16)
    run = simulate(policy, *table_curve({k: 1.05 * 0.8 ** abs(k - 3) for k in range(1, 17)}), steps=1000)
    plain_runs = _plain_runs(run)
    assert plain_runs and all(run.ks[i : i + 4] == [0] * 4 for i in plain_runs)
    last = 3
    for start in plain_runs:
        assert policy.baseline_refresh <= start - last <= policy.baseline_refresh + 16
        last = start + 3
    assert all(run.phases[i] == "baseline" for i in plain_runs)


def test_baseline_refresh_waits_while_speculation_pays_far_more():
    """At utility 2 a K = 0 step time off by 10% cannot flip the decision to speculate: the refresh period is
    stretched by (2 - 1) / tolerance to 1000 steps."""
    policy = UtilityKPolicy(max_k=16)
    run = simulate(policy, *table_curve(peaked(3)), steps=1200)
    plain_runs = _plain_runs(run)
    assert plain_runs and 1000 <= plain_runs[0] - 3 <= 1000 + 16
    assert all(run.ks[i : i + 4] == [0] * 4 and run.phases[i] == "baseline" for i in plain_runs)


# ------------------------------------------------------------------------------------- late and missing times
DOC_CURVE = (lambda k, i: 1.0 + 0.2 * k, lambda k, i: min(k, 2))


@pytest.mark.parametrize("lag", [1, 2])
@pytest.mark.parametrize("curve", ["doc", "adversarial", "peak_5"])
def test_late_outcomes_give_the_same_decisions(lag, curve):
    step_time, accepted = {
        "doc": DOC_CURVE,
        "adversarial": (ADVERSARIAL["linear"][0], never_accept),
        "peak_5": table_curve(peaked(5)),
    }[curve]
    on_time = simulate(UtilityKPolicy(max_k=16), step_time, accepted, steps=600)
    late = simulate(UtilityKPolicy(max_k=16), step_time, accepted, steps=600, lag=lag)
    assert late.ks == on_time.ks


def test_missing_times_contribute_nothing():
    step_time, accepted = DOC_CURVE
    timed = simulate(UtilityKPolicy(max_k=16), step_time, accepted, steps=600)
    partly = simulate(
        UtilityKPolicy(max_k=16), step_time, accepted, steps=600, drop_time=lambda i: i % 3 == 1
    )
    assert partly.ks == timed.ks


def test_no_times_at_all_keeps_k_start_and_never_crashes():
    run = simulate(UtilityKPolicy(max_k=16), *DOC_CURVE, steps=300, lag=1, drop_time=lambda i: True)
    # baseline, one trial at K_start extended by t steps while no time arrives, set phase at that K
    assert run.ks[:28] == [0] * 4 + [3] * 8 + [3] * 16
    assert run.states[12]["exit"] == "unmeasured"
    assert all(state["utility"] is None for state in run.states)
    assert set(run.ks) == {0, 3}


def test_malformed_outcomes_are_ignored():
    step_time, accepted = DOC_CURVE
    clean = simulate(UtilityKPolicy(max_k=16), step_time, accepted, steps=200)
    policy = UtilityKPolicy(max_k=16)
    ks = []
    for i in range(200):
        k = policy.next_k()
        ks.append(k)
        real = StepOutcome(index=i, k=k, accepted=[accepted(k, i)], time_s=step_time(k, i))
        policy.observe(StepOutcome(index=i + 5, k=k, accepted=[k], time_s=1e-9))  # a step not issued yet
        policy.observe(real)
        policy.observe(StepOutcome(index=i, k=k, accepted=[k], time_s=1e-9))  # a second report of step i
    assert ks == clean.ks

    for bad in (float("nan"), float("inf"), -1.0, 0.0, "fast", None):
        policy = UtilityKPolicy(max_k=16)
        ks = []
        for i in range(60):
            k = policy.next_k()
            ks.append(k)
            seconds = bad if 4 <= i < 8 else step_time(k, i)  # the first trial's times are unusable
            policy.observe(StepOutcome(index=i, k=k, accepted=[accepted(k, i)], time_s=seconds))
        assert ks[4:13] == [3] * 5 + [4] * 4, bad  # one extra step at K = 3 until a usable time arrived
        assert math.isfinite(policy.state()["utility"])


def test_never_observed_outcomes_are_bounded():
    policy = UtilityKPolicy(max_k=16)
    ks = [policy.next_k() for _ in range(3000)]
    assert len(policy._pending) <= 1024
    assert set(ks) == {0, 3}


# --------------------------------------------------------------------------------------- config and docs
def test_from_config_and_registry():
    config = SpeculationConfig(
        k_policy="utility",
        num_draft_tokens=4,
        max_draft_tokens=8,
        utility_trial_steps=2,
        utility_max_trials=3,
        utility_set_steps=8,
        utility_k_start=5,
        utility_baseline_steps=3,
        utility_baseline_refresh=50,
        utility_tolerance=0.2,
    )
    policy = make_k_policy(config)
    assert isinstance(policy, UtilityKPolicy) and policy.needs_timing
    assert (policy.max_k, policy.start_k, policy.trial_steps, policy.max_trials) == (8, 5, 2, 3)
    assert (policy.set_steps, policy.baseline_steps, policy.baseline_refresh) == (8, 3, 50)
    assert policy.tolerance == 0.2
    assert [policy.next_k() for _ in range(5)] == [0, 0, 0, 5, 5]
    expected = {
        "phase": "test",
        "k": 5,
        "utility": None,
        "trial_k": None,
        "baseline_s": None,
        "best_k": None,
        "set_steps": 8,
        "exit": None,
    }
    assert policy.state() == expected


@pytest.mark.parametrize(
    "kwargs", [{"k_start": 0}, {"k_start": 9}, {"tolerance": 1.0}, {"trial_steps": 0}, {"set_steps": 0}]
)
def test_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        UtilityKPolicy(max_k=8, **kwargs)


def test_docstring_examples_run():
    result = doctest.testmod(utility_policy)
    assert result.failed == 0 and result.attempted >= 8


def test_warm_start_from_the_previous_request():
    """A request's first trial starts at the best K its predecessor found (drafts right up to 6 tokens)."""
    first = UtilityKPolicy(max_k=16)
    run = simulate(first, lambda k, i: 1.0 + 0.05 * k, lambda k, i: min(k, 6), steps=300)
    best = first.recent_best_k()
    assert best is not None and best > first.start_k
    second = UtilityKPolicy(max_k=16)
    second.warm_start(best)
    assert [second.next_k() for _ in range(5)] == [0, 0, 0, 0, best]
    assert run.ks[4] == 3  # the cold request started at K_start
    second.warm_start(0)  # out of range: ignored
    assert second.start_k == best


def test_warm_start_speculating_skips_the_relearning():
    """A request whose predecessor ended speculating at K starts there for a set phase, then measures its K = 0
    baseline and tests (from that K); a K the predecessor did not end speculating at (None) starts cold."""
    first = UtilityKPolicy(max_k=8)
    simulate(first, lambda k, i: 1.0 + 0.05 * k, lambda k, i: k, steps=80)  # every draft accepted: K = 8 pays
    set_k = first.speculating_k()
    assert set_k is not None and set_k >= 4 and first.switched_off_steps() is None
    second = UtilityKPolicy(max_k=8)
    second.warm_start(first.recent_best_k(), first.switched_off_steps(), set_k)
    run = simulate(second, lambda k, i: 1.0 + 0.05 * k, lambda k, i: k, steps=second.set_steps + 5)
    assert run.ks[: second.set_steps] == [set_k] * second.set_steps
    assert run.ks[second.set_steps : second.set_steps + 4] == [0, 0, 0, 0]  # the baseline the test needs
    assert run.ks[second.set_steps + 4] > 0
    cold = UtilityKPolicy(max_k=8)
    cold.warm_start(first.recent_best_k(), None, None)
    assert [cold.next_k() for _ in range(4)] == [0, 0, 0, 0]


def test_switched_off_back_off_carries_to_the_next_request():
    """A request that ends with speculation switched off (nothing accepted, each draft token costs time) hands its
    back-off to the next one: after the baseline it stays at K = 0 for that many steps before testing again (K = 1
    first), instead of paying for a fresh test at K_start."""
    never = lambda k, i: 0  # noqa: E731
    cost = lambda k, i: 1.0 + 0.3 * k  # noqa: E731
    first = UtilityKPolicy(max_k=8)
    cold = simulate(first, cost, never, steps=24)
    assert any(k > 0 for k in cold.ks)  # the cold request tested
    off = first.switched_off_steps()
    assert off is not None and off >= 2 * first.set_steps
    assert first.recent_best_k() is not None  # measured, though not worth it

    second = UtilityKPolicy(max_k=8)
    second.warm_start(first.recent_best_k(), off)
    warm = simulate(second, cost, never, steps=4 + off + 1)
    assert warm.ks[: 4 + off] == [0] * (4 + off)
    assert warm.ks[4 + off] == 1  # then the cheapest test
    assert warm.time / len(warm.ks) < cold.time / len(cold.ks)


def test_speculation_that_pays_is_not_switched_off_next_time():
    first = UtilityKPolicy(max_k=8)
    simulate(first, lambda k, i: 1.0 + 0.1 * k, lambda k, i: k, steps=60)
    assert first.switched_off_steps() is None
    second = UtilityKPolicy(max_k=8)
    second.warm_start(first.recent_best_k(), first.switched_off_steps())
    assert [second.next_k() for _ in range(5)][4] > 0


# ------------------------------------------------------------------------------ saturation jump, baseline carry
def simulate_drafts(policy: UtilityKPolicy, step_time: StepTime, right: int, steps: int) -> Run:
    """Like `simulate`, with the drafts proposed reported: the drafter proposes K drafts and the first ``right``
    of them are accepted."""
    ks, states = [], []
    total_time = tokens = 0.0
    for i in range(steps):
        k = policy.next_k()
        accepted = min(k, right)
        total_time += step_time(k, i)
        tokens += 1 + accepted
        policy.observe(StepOutcome(index=i, k=k, accepted=[accepted], time_s=step_time(k, i), drafted=[k]))
        ks.append(k)
        states.append(policy.state())
    return Run(ks, states, total_time, tokens)


def test_saturated_trials_jump_to_twice_k():
    """Every draft accepted (drafts cut by K) and utility >= 1: the next trial doubles K (capped at max_k)
    instead of climbing by one, and the converged exit does not stop it."""
    cost = lambda k, i: 1.0 + 0.05 * k  # noqa: E731
    run = simulate_drafts(UtilityKPolicy(max_k=8), cost, right=8, steps=40)
    assert run.first_test() == [3] * 4 + [6] * 4 + [8] * 4
    set_k = next(k for phase, k, _ in run.segments() if phase == "set")
    assert set_k == 8
    # the same curve without the drafted counts climbs one K per trial and stops at max_trials
    plain = simulate(UtilityKPolicy(max_k=8), cost, lambda k, i: k, steps=40)
    assert plain.first_test() == [3] * 4 + [4] * 4 + [5] * 4 + [6] * 4
    assert run.tokens / run.time > plain.tokens / plain.time


def test_a_fall_after_a_jump_tries_the_middle_of_the_bracket():
    """Drafts right up to 3 tokens: K = 3 is saturated (jump to 6); K = 6 buys nothing more and costs more, so
    the next trial is the middle of the bracket (4), which points back to the best, K = 3."""
    cost = lambda k, i: 1.0 + 0.1 * k  # noqa: E731
    run = simulate_drafts(UtilityKPolicy(max_k=8), cost, right=3, steps=40)
    assert run.first_test() == [3] * 4 + [6] * 4 + [4] * 4
    assert next(k for phase, k, _ in run.segments() if phase == "set") == 3
    assert run.states[12 + 4]["exit"] == "peak"


def test_baseline_carries_to_the_next_request_and_ages():
    """With the previous request's K = 0 step time (same shape), a request skips the B baseline steps; the
    baseline's age counts across requests, so a refresh still comes every `baseline_refresh` steps."""
    cost = lambda k, i: 1.0 + 0.1 * k  # noqa: E731
    first = UtilityKPolicy(max_k=8)
    simulate_drafts(first, cost, right=2, steps=30)
    baseline = first.remembered_baseline()
    assert baseline is not None and baseline[0] == 1.0 and baseline[1] >= 1
    second = UtilityKPolicy(max_k=8)
    second.warm_start(first.recent_best_k(), first.switched_off_steps(), None, baseline)
    ks = [second.next_k() for _ in range(4)]
    assert ks == [first.recent_best_k()] * 4  # testing at once: no K = 0 step
    # an old baseline is refreshed first
    stale = UtilityKPolicy(max_k=8)
    stale.warm_start(3, None, None, (1.0, stale.baseline_refresh))
    assert [stale.next_k() for _ in range(5)] == [0, 0, 0, 0, 3]
    for bad in [(float("nan"), 0), (0.0, 1), (1.0, -1), ("x", 1), None]:
        policy = UtilityKPolicy(max_k=8)
        policy.warm_start(3, None, None, bad)  # unusable: the cold start
        assert [policy.next_k() for _ in range(5)] == [0, 0, 0, 0, 3]


# ----------------------------------------------------------------------- pooled estimates (censored run lengths)
Step = utility_policy.Step
Draft = Callable[
    [int, int], "tuple[int, int]"
]  # (K issued, step index) -> (K run: drafts proposed, accepted)


def simulate_drafter(
    policy: UtilityKPolicy, step_time: StepTime, draft: Draft, steps: int, lag: int = 0
) -> Run:
    """Like `simulate`, with a drafter that may propose fewer than K drafts: the loop then runs (and times) the
    step at the K proposed, and reports that K, as `speculative_decode` does. ``step_time`` takes the K run."""
    ks, states, queue = [], [], []
    total_time = tokens = 0.0
    for i in range(steps):
        k = policy.next_k()
        ran, accepted = draft(k, i) if k > 0 else (0, 0)
        assert 0 <= accepted <= ran <= k
        seconds = step_time(ran, i) if k > 0 else 1.0
        total_time += seconds
        tokens += 1 + accepted
        queue.append(StepOutcome(index=i, k=ran, accepted=[accepted], time_s=seconds, drafted=[ran]))
        if len(queue) > lag:
            policy.observe(queue.pop(0))
        ks.append(k)
        states.append(policy.state())
    return Run(ks, states, total_time, tokens)


def test_run_length_survival_censors_rows_cut_by_k():
    survival = utility_policy.run_length_survival
    # every draft accepted at K = 3: runs are at least 3, nothing is known beyond
    assert survival([Step(3, 3, (3,), 1.0)] * 4, 5) == [1.0, 1.0, 1.0, 1.0, None, None]
    # a rejection shows the run: 1 of 4 stopped at 1, the others go on to K = 4
    steps = [Step(4, 4, (1,), 1.0)] + [Step(4, 4, (4,), 1.0)] * 3
    assert survival(steps, 5) == [1.0, 1.0, 0.75, 0.75, 0.75, None]
    # the drafter had only 2 drafts (the loop ran K = 2 of 6): both accepted is the whole run, not a cut
    assert survival([Step(6, 2, (2,), 1.0)], 4) == [1.0, 1.0, 1.0, 0.0, 0.0]
    # rows of a batch are samples; a run cut at a smaller K still counts up to that K
    assert survival([Step(2, 2, (2, 0), 1.0), Step(4, 4, (3, 4), 1.0)], 4) == [1.0, 0.75, 0.75, 0.75, 0.375]


def test_step_costs_are_medians_interpolated_between_well_seen_ks():
    times = {
        0: [1.0, 1.1, 0.9],
        3: [5.0],
        8: [2.0, 2.0, 20.0],
    }  # K = 3 seen once (inside: ignored), 8 has an outlier
    costs = utility_policy.step_costs(times, 10)
    assert costs[0] == pytest.approx(1.0) and costs[8] == pytest.approx(2.0)
    assert costs[4] == pytest.approx(1.5)  # on the line from K = 0 to 8, not through the lone K = 3 step
    assert costs[9] is None and costs[10] is None  # no extrapolation
    assert utility_policy.step_costs({}, 4) == [None] * 5


def test_pooled_utilities_judge_every_k_on_the_same_steps():
    """Steps at K = 8 tell what K = 1 .. 8 would have emitted on the same text; a step whose drafter had no draft
    costs what a K = 0 verify costs at every K."""
    costs = [1.2] + [1.0 + 0.1 * k for k in range(1, 9)]
    steps = [Step(8, 8, (8,), 1.8), Step(8, 8, (2,), 1.8), Step(8, 0, (0,), 1.2), Step(8, 8, (0,), 1.8)]
    pooled = utility_policy.pooled_utilities(steps, range(1, 9), 8, 1.0, costs)
    for k in range(1, 9):
        tokens = sum(1 + min(a, k) for a in (8, 2, 0, 0))
        seconds = 1.2 + 3 * costs[k]
        assert pooled[k] == pytest.approx(tokens / seconds)
    # without a step time at K = 9's width nothing is said about it; an upper bound fills the unknown runs
    assert utility_policy.pooled_utilities(steps, [9], 9, 1.0, costs + [None])[9] is None
    upper = utility_policy.pooled_utilities(steps, [9], 9, 1.0, costs + [1.9], optimistic=True)[9]
    assert upper == pytest.approx((10 + 3 + 1 + 1) / (1.2 + 3 * 1.9))


def test_bursty_drafts_are_compared_on_the_same_text():
    """Drafts are all right in alternate 6-step bursts and all wrong in between; a step costs 2% more per draft
    token, so the largest K is the best static K. Trials judged on their own 4 steps see bursts, not K (the
    paper's rule settles on K = 2 here, 0.33 of the best static K); pooled over the test phase they find K = 8."""
    cost = lambda k, i: 1.0 + 0.02 * k  # noqa: E731
    burst = lambda k, i: (k, k if (i // 6) % 2 == 0 else 0)  # noqa: E731
    run = simulate_drafter(UtilityKPolicy(max_k=8), cost, burst, steps=400)
    static = simulate_drafter(ConstantKPolicy(8, 8), cost, burst, steps=400)
    assert run.tokens / run.time >= 0.9 * static.tokens / static.time
    assert run.ks[-100:] == [8] * 100


def test_confident_set_phases_skip_the_test():
    """Every draft right, and a step where the drafter finds nothing (every 5th) shows the cost of a one-token
    verify: after the first set phase at K_max every K up to it is estimated from its steps, so set phases follow
    each other without test phases (exit "confident")."""
    cost = lambda k, i: 1.1 + 0.01 * k  # noqa: E731
    draft = lambda k, i: (0, 0) if i % 5 == 0 else (k, k)  # noqa: E731
    run = simulate_drafter(UtilityKPolicy(max_k=8), cost, draft, steps=300)
    first_set = _set_starts(run)[0]
    assert run.ks[first_set] == 8
    later = run.phases[first_set + 16 :]
    assert "test" not in later and "baseline" not in later
    assert {state["exit"] for state in run.states[first_set + 16 :]} == {"confident"}


def test_set_phase_cut_by_k_becomes_the_first_trial():
    """A request warm-started at K = 3 whose drafts are all right: after 2 steps the set phase ends (K, not the
    drafter, limited every step), counts as the first trial and the saturation jump follows: 3 -> 6 -> 8; every
    draft accepted at K_max ends the test there (no trial below it)."""
    policy = UtilityKPolicy(max_k=8)
    policy.warm_start(3, None, 3, (1.0, 0))
    run = simulate_drafter(policy, lambda k, i: 1.0 + 0.05 * k, lambda k, i: (k, k), steps=30)
    assert run.ks[:10] == [3] * 2 + [6] * 4 + [8] * 4
    assert run.phases[:2] == ["set"] * 2 and run.phases[2:10] == ["test"] * 8
    assert run.states[10]["exit"] == "k_max" and set(run.ks[10:]) == {8}


def test_set_phase_cut_by_k_waits_for_two_saturated_steps():
    """A set phase at K = 4 is cut only when its last 2 drafting steps accepted every draft: one burst step among
    rejections does not end it, two in a row do (at the next even step of the phase)."""
    policy = UtilityKPolicy(max_k=8)
    policy.warm_start(4, None, 4, (1.0, 0))
    draft = lambda k, i: (k, k if i in (1, 4, 5) else 1)  # noqa: E731
    run = simulate_drafter(policy, lambda k, i: 1.0 + 0.05 * k, draft, steps=10)
    assert run.ks[:6] == [4] * 6 and run.phases[:6] == ["set"] * 6
    assert run.phases[6] == "test" and run.ks[6] == 8


def test_saturated_first_trial_at_max_k_ends_the_test():
    """The first trial runs at K_max and accepts every draft: K_max - 1 can only emit less, so the set phase follows
    at K_max (the paper's climb would try K_max - 1 next)."""
    assert plan_next_trial([(8, 3.0)], max_k=8, max_trials=4, tolerance=0.1, saturated=True) == (
        None,
        "k_max",
    )
    assert plan_next_trial([(8, 3.0)], max_k=8, max_trials=4, tolerance=0.1) == (7, "climb")
    policy = UtilityKPolicy(max_k=8, k_start=8)
    run = simulate_drafter(policy, lambda k, i: 1.0 + 0.02 * k, lambda k, i: (k, k), steps=30)
    assert run.first_test() == [8] * 4 and 7 not in run.ks


def test_a_request_ending_in_a_test_that_pays_is_not_handed_on_switched_off():
    """Speculation switched off (nothing accepted), then drafts turn right and the test phase after the K = 0 set
    phase finds K = 1 pays; a request that ends there hands on that K, not its back-off."""
    good_from = 4 + 12 + 32
    draft = lambda k, i: (k, k if i >= good_from else 0)  # noqa: E731
    policy = UtilityKPolicy(max_k=8)
    run = simulate_drafter(policy, lambda k, i: 1.0 + 0.5 * k, draft, steps=good_from + 4 + 1)
    assert run.ks[good_from : good_from + 4] == [1] * 4 and run.phases[-1] == "test"
    assert policy.switched_off_steps() is None
    assert policy.speculating_k() == 1


def test_a_drafter_with_nothing_to_propose_is_switched_off():
    """Prompt lookup finds no draft: every speculative step runs a one-token verify that costs 20% more than a
    plain step (the search). Speculation is switched off with back-off, within the paper's 5% bound."""
    run = simulate_drafter(UtilityKPolicy(max_k=8), lambda k, i: 1.2, lambda k, i: (0, 0), steps=2000)
    assert run.time / run.tokens - 1 <= 0.05
    assert sum(k > 0 for k in run.ks) <= 40


@pytest.mark.parametrize("lag", [1, 2])
def test_late_outcomes_give_the_same_decisions_with_cuts_and_confident_sets(lag):
    cost = lambda k, i: 1.1 + 0.01 * k  # noqa: E731
    draft = lambda k, i: (0, 0) if i % 5 == 0 else (k, min(k, 5 if i % 3 else 8))  # noqa: E731
    on_time = simulate_drafter(UtilityKPolicy(max_k=8), cost, draft, steps=400)
    late = simulate_drafter(UtilityKPolicy(max_k=8), cost, draft, steps=400, lag=lag)
    assert late.ks == on_time.ks
    assert {"confident", "converged"} & {state["exit"] for state in on_time.states}


def test_no_switch_off_while_the_last_trial_pays():
    """Drafts are wrong until step 12, then all right; a draft token costs 60% of a plain step. Over the test
    phase (K = 3, 2, 1) the pooled utility of K = 1 is 0.83, but the trial at K = 1 alone, on the text as it is
    now, measures 1.25: speculation stays on at K = 1 instead of switching off for 32 steps (and, every draft
    being accepted at K = 1, climbs from there)."""
    draft = lambda k, i: (k, k if i >= 12 else 0)  # noqa: E731
    run = simulate_drafter(UtilityKPolicy(max_k=8), lambda k, i: 1.0 + 0.6 * k, draft, steps=40)
    assert run.first_test() == [3] * 4 + [2] * 4 + [1] * 4
    assert run.states[16]["exit"] == "k_zero" and run.states[16]["phase"] == "set"
    assert run.ks[16:20] == [1] * 4 and 0 not in run.ks[16:] and run.ks[-1] == 8
