"""Exact offline replay of ``bench_cascade.py --suite e2e``: K policies on CPU, step times from a cost model.

Greedy verification is lossless, so a request's continuation is the same at every K, and prompt lookup's draft at
a position depends only on the history. So each workload request of the benchmark (same prompts, cut, shuffles and
seeds: `bench_cascade.workloads`) is generated once with plain greedy ``model.generate`` (CPU, float32), and for
every position and every K the draft the loop would get (the library's own `NgramIndex`, which
`PromptLookupDrafter` searches at batch 1) and how many of its tokens the target accepts are tabulated. A request
is then replayed under any K policy exactly as `speculative_decode` runs it:

- ``k = min(policy.next_k(), max_draft_tokens, remaining - 1)``; at ``k = 0`` the drafter is not called (a plain
  step); else the draft is ``lookup(k)`` and the loop trims K to its length (0 when nothing recurs: a verify
  step of one token that still paid for the search);
- ``policy.observe(StepOutcome(step, trimmed k, [accepted], time_s, drafted=[trimmed k]))`` after every step,
  then ``policy.state()``; the step emits ``accepted + 1`` tokens;
- between requests the policy memory of ``generation/generate.py`` is mirrored: ``warm_start`` with the previous
  request's ``recent_best_k``, ``switched_off_steps``, ``speculating_k`` and ``remembered_baseline``, in the
  benchmark's order (one warm-up request on the first ``good`` prompt, then every workload's prompts, per repeat).

Step times: a per-model cost model fitted to the H200 run (``--fit``, default
the ``e2e`` record of ``results/cascade.json``): the timed cost of a speculative step as a function of its trimmed k
(robust linear fit over the traced steps with k >= 1; the median of the traced steps trimmed to k = 0), the timed
cost of a plain step, an untimed overhead per step and a fixed cost per request (prefill, setup) from a least-squares
fit of every K = 0 and static-K request's wall time (static requests whose replayed step count equals the H200
one). Noise, resampled: per step, the traced steps' spread around the fit (within each traced request); per request
(all its steps and its fixed cost), the spread of those requests' wall times around the fit. Every configuration
draws the same noise for the same request and step (common random numbers). ``--noise-scale 2`` doubles the
per-step spread in log (not the rare hiccups), for timing noise the trace under-states; the run prints the traced
spread beside the replayed one (`noise_check`). ``--steep 3 5`` also replays cost
curves where a K = 8 step costs 3x, 5x a plain step (a large MoE). Tokens/s = total new tokens / total seconds (per
prompt the median over repeats), as in ``bench_cascade.summarize_e2e``. Deterministic: the same seeds give the
same numbers.

    PYTHONPATH=. python benchmarks/replay_cascade.py --steep 3 5 --compare-rev f91268a
    # ~1 min, record "default" of results/replay_cascade.json; --compare-rev: also the policy of a git revision
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_cascade import FULL, WORKLOADS, Sizes, configurations, workloads
from benchmarks.bench_generate import machine_info
from hf_sparse_verify.config import SpeculationConfig
from hf_sparse_verify.generation.drafters.prompt_lookup import NgramIndex, PromptLookupDrafter, lookup_ngram
from hf_sparse_verify.generation.policies.k_policy import KPolicy, StepOutcome, make_k_policy

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("code-moe", "code-target")
POLICY_MODULE = "hf_sparse_verify/generation/policies/utility_policy.py"


# ------------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Request:
    """One benchmark request: its greedy continuation and, per position, prompt lookup's draft at every K.

    ``drafts[g][k]`` = ``(drafted, accepted)`` when ``g`` new tokens are committed and the loop asks for ``k``
    drafts (``1 <= k <= max_k``; ``g >= 1``: the prefill emits the first token).
    """

    model: str
    workload: str
    prompt: int
    new_tokens: int
    drafts: tuple[tuple[tuple[int, int], ...], ...]


def draft_table(
    prompt: list[int], continuation: list[int], max_k: int, drafter: PromptLookupDrafter
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """``(drafted, accepted)`` for every position ``g`` in ``[0, len(continuation))`` and K in ``[0, max_k]``
    (row 0 and column 0 are ``(0, 0)``: no step drafts there). Uses the drafter's own incremental index."""
    index = NgramIndex(drafter.max_ngram, drafter.min_ngram)
    index.extend(prompt)
    rows = [tuple((0, 0) for _ in range(max_k + 1))]
    for g in range(1, len(continuation)):
        index.extend(continuation[g - 1 : g])
        row = [(0, 0)]
        for k in range(1, max_k + 1):
            draft = index.lookup(k)
            accepted = 0
            end = min(len(draft), len(continuation) - g)  # K past the end is never asked for
            while accepted < end and draft[accepted] == continuation[g + accepted]:
                accepted += 1
            row.append((len(draft), accepted))
        rows.append(tuple(row))
    return tuple(rows)


def check_against_reference(
    prompt: list[int], continuation: list[int], request: Request, drafter, every: int
):
    """Every ``every``-th position: the index's drafts equal `lookup_ngram` (the numpy reference) at every K."""
    for g in range(1, len(continuation), every):
        history = np.array(prompt + continuation[:g])
        for k in range(1, len(request.drafts[g])):
            reference = lookup_ngram(history, k, drafter.max_ngram, drafter.min_ngram)
            assert request.drafts[g][k][0] == len(reference), (request.model, request.workload, g, k)


@torch.no_grad()
def build_requests(shared: Path, sizes: Sizes, max_k: int, check_every: int) -> dict[str, list[Request]]:
    """Per model, the benchmark's requests in its order (workload by workload, prompt by prompt)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    drafter = PromptLookupDrafter.from_config(SpeculationConfig(strategy="prompt_lookup"))
    out: dict[str, list[Request]] = {}
    for name in MODELS:
        model = AutoModelForCausalLM.from_pretrained(shared / name, dtype=torch.float32).eval()
        loads = workloads(shared, tok, sizes, model.config.vocab_size)
        out[name] = []
        for workload in WORKLOADS:
            for p, ids in enumerate(loads[workload]):
                seq = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=sizes.new_tokens,
                    do_sample=False,
                )  # fmt: skip
                prompt, continuation = ids[0].tolist(), seq[0, ids.shape[1] :].tolist()
                if len(continuation) != sizes.new_tokens:
                    raise ValueError(
                        f"{name} {workload} prompt {p} stopped after {len(continuation)} tokens (EOS): the replay "
                        f"assumes every request generates {sizes.new_tokens}; use other prompts or fewer new tokens"
                    )
                table = draft_table(prompt, continuation, max_k, drafter)
                request = Request(name, workload, p, len(continuation), table)
                if check_every:
                    check_against_reference(prompt, continuation, request, drafter, check_every)
                out[name].append(request)
        del model
    return out


# ------------------------------------------------------------------------------------------------ cost model
def _ordinary(factor: float) -> bool:
    """A per-step noise factor within [1/2, 2]; the rarer ones beyond are hiccups (a request's first step takes
    ~3.5x), which `CostModel.noisier` leaves as traced."""
    return 0.5 <= factor <= 2.0


@dataclass(frozen=True)
class CostModel:
    """Seconds of one step and of one request's fixed part.

    Attributes:
        plain_s: timed plain step (the policy issued K = 0: no draft search).
        spec_s: timed step where the drafter was asked, by trimmed k (index 0: nothing found, a one-token verify).
        overhead_s: untimed host work per step (policy, stats, streaming).
        request_s: fixed per request (prefill, first token, setup).
        noise: multiplicative factors, one drawn per step (the spread of a traced request's steps around the fit,
            each traced request divided by its own median factor).
        request_noise: multiplicative factors, one drawn per request for all its steps and its fixed cost (the
            spread of the fit run's K = 0 and static-K requests around the fit: clocks, host jitter).
    """

    name: str
    plain_s: float
    spec_s: tuple[float, ...]
    overhead_s: float
    request_s: float
    noise: tuple[float, ...]
    request_noise: tuple[float, ...] = (1.0,)

    def step_s(self, asked: bool, k: int, rng: random.Random, request_factor: float = 1.0) -> float:
        base = self.spec_s[k] if asked else self.plain_s
        return base * rng.choice(self.noise) * request_factor

    def noisier(self, scale: float) -> CostModel:
        """The same model with each per-step factor ``f`` within ``[1/2, 2]`` raised to ``scale`` (its spread in
        log scaled by ``scale``); the rarer hiccups beyond (a request's first step takes ~3.5x) stay as traced."""
        noise = tuple(f**scale if _ordinary(f) else f for f in self.noise)
        return replace(self, noise=noise)

    def steep(self, ratio: float = 3.0) -> CostModel:
        """The same model with speculative steps growing linearly to ``ratio`` x a plain step at the largest k."""
        top = len(self.spec_s) - 1
        spec = tuple(
            self.spec_s[0] + (ratio * self.plain_s - self.spec_s[0]) * k / top for k in range(top + 1)
        )
        return replace(self, name=f"{self.name}-steep{ratio:g}x", spec_s=spec)


def _l1_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` minimising ``sum |y - a - b x|`` (iteratively reweighted least squares)."""
    design = np.stack([np.ones_like(x), x], axis=1)
    weights = np.ones_like(y)
    for _ in range(100):
        root = np.sqrt(weights)[:, None]
        coef = np.linalg.lstsq(design * root, y * root[:, 0], rcond=None)[0]
        weights = 1.0 / np.maximum(np.abs(y - design @ coef), 1e-6)
    return float(coef[0]), float(coef[1])


def fit_cost_model(fit: dict, name: str, requests: list[Request], max_k: int) -> tuple[CostModel, dict]:
    """Fit the model of `CostModel` for ``name`` to a bench_cascade e2e JSON (see the module docstring)."""
    traced = [
        (k, t) for tr in fit["traces"] if tr["model"] == name for k, t in zip(tr["k"], tr["step_times_s"])
    ]
    if not traced:
        raise ValueError(f"the fit JSON has no utility trace of {name}: run bench_cascade.py --suite e2e")
    trimmed = statistics.median(t for k, t in traced if k == 0)
    ks = np.array([k for k, _ in traced if k > 0], dtype=float)
    a, b = _l1_line(ks, np.array([t for k, t in traced if k > 0]))
    if b < 0:  # a falling cost in k is noise: flat at the median
        a, b = float(np.median([t for k, t in traced if k > 0])), 0.0
    spec = (trimmed, *(a + b * k for k in range(1, max_k + 1)))
    noise = []
    for trace in fit["traces"]:
        if trace["model"] == name:
            factors = [t / spec[k] for k, t in zip(trace["k"], trace["step_times_s"])]
            noise += [f / statistics.median(factors) for f in factors]

    # wall = request_s + steps * overhead_s + plain steps * plain_s + sum(spec_s of the drafting requests' steps)
    by_prompt = {(r.workload, r.prompt): r for r in requests}
    rows, wall, fixed_s, used = [], [], [], 0  # fixed_s: the static requests' known speculative step time
    for record in fit["e2e_records"]:
        config = record["config"]
        if record["model"] != name or not (config == "k0_ours" or config.startswith("static_k")):
            continue
        if config == "k0_ours":
            rows.append([1.0, record["steps"], record["steps"]])
            wall.append(record["seconds"])
            fixed_s.append(0.0)
            used += 1
            continue
        k = int(config.removeprefix("static_k"))
        steps = replay_fixed(by_prompt[(record["workload"], record["prompt"])], k)
        if len(steps) != record["steps"]:
            continue  # the bf16 continuation of the H200 run differs from ours here
        rows.append([1.0, record["steps"], 0.0])
        fixed_s.append(sum(spec[d] for d in steps))
        wall.append(record["seconds"] - fixed_s[-1])
        used += 1
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(wall), rcond=None)
    residual = np.array(wall) - np.array(rows) @ coef
    predicted = np.array(rows) @ coef + (np.array(fixed_s))
    request_noise = tuple((np.array(wall) + np.array(fixed_s)) / predicted)
    model = CostModel(name, float(coef[2]), spec, float(coef[1]), float(coef[0]), tuple(noise), request_noise)
    report = {
        "traced_steps": len(traced),
        "spec_linear_s": [a, b],
        "wall_fit_requests": used,
        "wall_fit_rms_s": float(np.sqrt(np.mean(residual**2))),
    }
    return model, report


def noise_check(fit: dict, cost: CostModel, scale: float = 1.0) -> dict:
    """The traced steps' spread (after each request's first step, a ~3.5x hiccup) against the replay's per-step
    noise: std of log step time within each traced request at one K (groups of >= 3 steps, pooled), std of log
    residual around the fit (each request over its median), its lag-1 autocorrelation (the replay draws
    independent factors), and the std of log of the replay's factors within [1/2, 2] once `CostModel.noisier`
    scales them by ``scale`` (``cost`` unscaled)."""
    same_k, residuals, lag = [], [], []
    for trace in fit["traces"]:
        if trace["model"] != cost.name.split("-steep")[0]:
            continue
        ks, times = trace["k"][1:], np.array(trace["step_times_s"][1:])
        for k in set(ks):
            logs = np.log(times[[i for i, kk in enumerate(ks) if kk == k]])
            if len(logs) >= 3:
                same_k += list(logs - logs.mean())
        res = np.log(times / np.array([cost.spec_s[k] for k in ks]))
        res -= np.median(res)
        residuals += list(res)
        centred = res - res.mean()
        lag += list(centred[1:] * centred[:-1])
    residuals = np.array(residuals)
    factors = np.log([f for f in cost.noise if _ordinary(f)])
    return {
        "traced_same_k_log_std": float(np.std(same_k)),
        "traced_residual_log_std": float(residuals.std()),
        "traced_residual_lag1_autocorrelation": float(
            np.sum(lag) / np.sum((residuals - residuals.mean()) ** 2)
        ),
        "replay_log_std": float(scale * factors.std()),
        "replay_hiccups": sum(not _ordinary(f) for f in cost.noise) / len(cost.noise),
    }


def replay_fixed(request: Request, k: int) -> list[int]:
    """Trimmed k of every step of a static-K request."""
    g, steps = 1, []
    while g < request.new_tokens:
        kk = min(k, request.new_tokens - g - 1)
        drafted, accepted = request.drafts[g][kk] if kk > 0 else (0, 0)
        steps.append(drafted)
        g += accepted + 1
    return steps


# ------------------------------------------------------------------------------------------------ the replay
@dataclass
class RequestRun:
    steps: int = 0
    drafting_steps: int = 0
    accepted: int = 0
    tokens: int = 0
    wall_s: float = 0.0
    issued: list[int] | None = None
    ks: list[int] | None = None
    accepted_steps: list[int] | None = None
    phases: list[str] | None = None


def replay_request(
    request: Request, policy: KPolicy, max_draft_tokens: int, cost: CostModel, rng: random.Random
) -> RequestRun:
    """One request through ``policy`` exactly as `speculative_decode` drives it (batch 1, greedy)."""
    run = RequestRun(tokens=request.new_tokens, wall_s=0.0, issued=[], ks=[], accepted_steps=[], phases=[])
    factor = rng.choice(cost.request_noise)  # this request's speed (clocks, host), for all its steps
    run.wall_s = cost.request_s * factor
    g = 1  # the prefill emitted the first token
    while g < request.new_tokens:
        remaining = request.new_tokens - g
        issued = policy.next_k()
        k = max(0, min(issued, max_draft_tokens, remaining - 1))
        drafted, accepted = request.drafts[g][k] if k > 0 else (0, 0)
        seconds = cost.step_s(k > 0, drafted, rng, factor)
        policy.observe(StepOutcome(run.steps, drafted, [accepted], seconds, drafted=[drafted]))
        state = policy.state()
        run.issued.append(issued)
        run.ks.append(drafted)
        run.accepted_steps.append(accepted)
        run.phases.append(state.get("phase", ""))
        run.steps += 1
        run.drafting_steps += drafted > 0
        run.accepted += accepted
        run.wall_s += seconds + cost.overhead_s * factor
        g += accepted + 1
    return run


class PolicyMemory:
    """What ``generation/generate.py`` carries from one request to the next on the same model, strategy and K
    policy (all requests here share batch size and length bucket, so one baseline slot)."""

    def __init__(self):
        self.learnt: tuple = (None, None, None)
        self.baseline: tuple[float, int] | None = None

    def start(self, policy: KPolicy) -> None:
        policy.warm_start(*self.learnt, self.baseline)

    def end(self, policy: KPolicy) -> None:
        self.learnt = (policy.recent_best_k(), policy.switched_off_steps(), policy.speculating_k())
        baseline = policy.remembered_baseline()
        if baseline is not None:
            self.baseline = baseline


def policy_factory(spec: dict, policy_class=None):
    """A function building a fresh policy for ``spec`` (a bench_cascade configuration dict), and its
    ``max_draft_tokens``. ``policy_class`` replaces the utility policy's class (another revision's)."""
    config = SpeculationConfig(**spec)
    if policy_class is not None and config.k_policy == "utility":
        return (lambda: policy_class.from_config(config)), config.max_draft_tokens
    return (lambda: make_k_policy(config)), config.max_draft_tokens


def replay_schedule(
    requests: list[Request], factory, max_draft_tokens: int, cost: CostModel, seed: int, repeats: int
) -> list[dict]:
    """The benchmark's order for one configuration: a warm-up request on the first prompt, then every request
    per repeat; one record per timed request. Step ``i`` of a request draws the same noise factor under every
    configuration."""
    memory = PolicyMemory()
    records = []
    for repeat in range(-1, repeats):
        for request in requests[:1] if repeat < 0 else requests:
            # one noise stream per request and seed, the same for every configuration (common random numbers)
            rng = random.Random(f"{seed}/{repeat}/{request.workload}/{request.prompt}")
            policy = factory()
            memory.start(policy)
            run = replay_request(request, policy, max_draft_tokens, cost, rng)
            memory.end(policy)
            if repeat >= 0:
                records.append(
                    {"workload": request.workload, "prompt": request.prompt, "repeat": repeat, "run": run}
                )
    return records


def summarize(records: list[dict]) -> dict[str, dict]:
    """Per workload and ``mix``: tokens/s (per prompt the median wall over repeats), mean acceptance length, mean K
    the policy issued."""
    per_prompt: dict[tuple, list[RequestRun]] = {}
    for r in records:
        per_prompt.setdefault((r["workload"], r["prompt"]), []).append(r["run"])
    groups: dict[str, dict] = {}
    for (workload, _), runs in per_prompt.items():
        for wl in (workload, "mix"):
            g = groups.setdefault(wl, dict(seconds=0.0, tokens=0, drafting=0, accepted=0, steps=0, issued=0))
            g["seconds"] += statistics.median(run.wall_s for run in runs)
            for run in runs:
                g["tokens"] += run.tokens / len(runs)
                g["drafting"] += run.drafting_steps
                g["accepted"] += run.accepted
                g["steps"] += run.steps
                g["issued"] += sum(run.issued)
    return {
        wl: {
            "tokens_per_s": g["tokens"] / g["seconds"],
            "mean_acceptance_length": 1 + g["accepted"] / g["drafting"] if g["drafting"] else None,
            "mean_issued_k": g["issued"] / g["steps"],
        }
        for wl, g in groups.items()
    }


def load_policy_class(rev: str):
    """``UtilityKPolicy`` of ``utility_policy.py`` at git revision ``rev`` (read with ``git show``), imported
    beside the current one so its relative imports resolve."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{POLICY_MODULE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    name = f"hf_sparse_verify.generation.policies._utility_policy_{abs(hash(rev))}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "hf_sparse_verify.generation.policies"
    exec(compile(source, f"{rev}:{POLICY_MODULE}", "exec"), module.__dict__)
    return module.UtilityKPolicy


def git_commit(rev: str) -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None


# ------------------------------------------------------------------------------------------------------ main
WORKLOADS_MIX = (*WORKLOADS, "mix")


def ratios(table: dict, policies: list[str], statics: list[str]) -> dict:
    """Per learning policy: tokens/s over the static K that is best on the mix (same K on every workload, as in
    the README table), and over our K = 0 path."""
    best = max(statics, key=lambda c: table[c]["mix"]["tokens_per_s"])
    out = {"best_static": best}
    for config in policies:
        out[config] = {
            wl: {
                "vs_best_static": table[config][wl]["tokens_per_s"] / table[best][wl]["tokens_per_s"],
                "vs_k0": table[config][wl]["tokens_per_s"] / table["k0_ours"][wl]["tokens_per_s"],
            }
            for wl in WORKLOADS_MIX
        }
    return out


def replay_cost_model(
    requests: list[Request], cost: CostModel, configs: dict, seeds: list[int], repeats: int
):
    """Every configuration under one cost model for every seed: the mean over seeds of each summary, the ratios
    of the mean, the spread of the mix ratio over seeds, and seed 0's issued K per request of each policy."""
    per_seed, traces = [], {}
    for seed in seeds:
        table = {}
        for config, (factory, max_k) in configs.items():
            records = replay_schedule(requests, factory, max_k, cost, seed, repeats)
            table[config] = summarize(records)
            if seed == seeds[0] and config.startswith("utility"):
                traces[config] = [
                    {"workload": r["workload"], "prompt": r["prompt"], "repeat": r["repeat"],
                     "issued_k": r["run"].issued, "k": r["run"].ks, "accepted": r["run"].accepted_steps}
                    for r in records
                ]  # fmt: skip
        per_seed.append(table)
    statics = [c for c in configs if c.startswith("static_k")]
    policies = [c for c in configs if c.startswith("utility")]
    mean = {c: {wl: _mean_of(t[c][wl] for t in per_seed) for wl in WORKLOADS_MIX} for c in configs}
    spread = {
        c: [ratios(t, policies, statics)[c]["mix"]["vs_best_static"] for t in per_seed] for c in policies
    }
    return {
        "summary": mean,
        "ratios": ratios(mean, policies, statics),
        "mix_ratio_per_seed": spread,
        "traces_seed0": traces,
    }


def _mean_of(summaries) -> dict:
    """Field by field mean of summaries (None where no summary has the field)."""
    summaries = list(summaries)
    out = {}
    for key in summaries[0]:
        values = [x[key] for x in summaries if x[key] is not None]
        out[key] = statistics.mean(values) if values else None
    return out


def faithfulness(fit: dict, requests: dict, result: dict, sizes: Sizes, baseline_policy: str | None) -> dict:
    """The replay against the fit run: static-K acceptance and step counts per request, tokens/s per configuration
    on the mix, and where the fit run's utility ratio falls among the replayed seeds of the same policy."""
    h200 = {(r["model"], r["workload"], r["config"]): r for r in fit["e2e"]}
    out: dict = {}
    for name in MODELS:
        summary = result[name]["summary"]
        static = {}
        for k in sizes.static_ks:
            records = [r for r in fit["e2e_records"] if r["model"] == name and r["config"] == f"static_k{k}"]
            by_prompt = {(r.workload, r.prompt): r for r in requests[name]}
            equal = sum(
                len(replay_fixed(by_prompt[(r["workload"], r["prompt"])], k)) == r["steps"] for r in records
            )
            static[f"static_k{k}"] = {
                "mean_acceptance_length": summary[f"static_k{k}"]["mix"]["mean_acceptance_length"],
                "h200": h200[(name, "mix", f"static_k{k}")]["mean_acceptance_length"],
                "requests_with_the_h200_step_count": f"{equal}/{len(records)}",
            }
        tokens = {
            c: {"replay": summary[c]["mix"]["tokens_per_s"], "h200": h200[(name, "mix", c)]["tokens_per_s"]}
            for c in summary
            if (name, "mix", c) in h200
        }
        entry = {"static_acceptance": static, "mix_tokens_per_s": tokens}
        target = next(t for t in fit["targets"] if t["model"] == name and "best static" in t["target"])
        entry["h200_utility_vs_best_static"] = target["ratio"]
        if baseline_policy is not None:
            seeds = result[name]["mix_ratio_per_seed"][baseline_policy]
            entry["replayed_same_policy_vs_best_static"] = {
                "mean": statistics.mean(seeds),
                "min": min(seeds),
                "max": max(seeds),
                "seeds_at_or_below_h200": sum(r <= target["ratio"] for r in seeds),
            }
        out[name] = entry
    return out


def table_lines(result: dict) -> list[str]:
    lines = []
    for cost_name, r in result.items():
        rat = r["ratios"]
        best = rat["best_static"]
        lines.append(
            f"{cost_name}: tokens/s, mean over seeds (mean K issued on the mix); best static K on the mix: {best}"
        )
        lines.append(f"  {'':18}" + "".join(f"{wl:>9}" for wl in WORKLOADS_MIX))
        for config, row in r["summary"].items():
            cells = "".join(f"{row[wl]['tokens_per_s']:9.0f}" for wl in WORKLOADS_MIX)
            lines.append(f"  {config:18}{cells}   (K {row['mix']['mean_issued_k']:.2f})")
        for config, per_wl in rat.items():
            if config == "best_static":
                continue
            seeds = r["mix_ratio_per_seed"][config]
            cells = " ".join(f"{wl} {per_wl[wl]['vs_best_static']:.3f}" for wl in WORKLOADS_MIX)
            lines.append(
                f"  {config} / {best}: {cells} (mix over seeds {min(seeds):.3f}..{max(seeds):.3f}); "
                f"mix / K=0 {per_wl['mix']['vs_k0']:.2f}"
            )
    return lines


def plot(result: dict, out: Path) -> Path:
    """Bars: each learning policy's tokens/s over the best static K per workload, one panel per cost model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result)
    cols = min(3, len(names))
    rows = -(-len(names) // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    axes = [list(grid.flat)]
    for ax, name in zip(axes[0], names):
        rat = result[name]["ratios"]
        policies = [c for c in rat if c != "best_static"]
        width = 0.8 / len(policies)
        for i, config in enumerate(policies):
            values = [rat[config][wl]["vs_best_static"] for wl in WORKLOADS_MIX]
            ax.bar([x + i * width for x in range(len(WORKLOADS_MIX))], values, width, label=config)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(policies) - 1) / 2 for x in range(len(WORKLOADS_MIX))], WORKLOADS_MIX)
        ax.set_title(f"{name}\n(best static: {rat['best_static']})", fontsize=9)
        ax.set_ylim(0.7, 1.1)
    for ax in grid[:, 0]:
        ax.set_ylabel("tokens/s / best static K")
    for ax in axes[0][len(names) :]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "replay of bench_cascade --suite e2e (CPU drafts and acceptance, H200-fitted step costs)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument(
        "--fit",
        default=str(ROOT / "benchmarks/results/cascade.json"),
        help="a bench_cascade.py results file (its --fit-setting record) or one run's JSON",
    )
    parser.add_argument("--fit-setting", default="e2e", help="the record of --fit to fit the cost model to")
    _records.add_arguments(parser, "replay_cascade", default_setting="default")
    parser.add_argument("--seeds", type=int, default=20, help="noise seeds (0 .. n-1)")
    parser.add_argument("--repeats", type=int, default=None, help="default: the fit run's")
    parser.add_argument(
        "--steep",
        type=float,
        nargs="*",
        default=[],
        help="also replay cost curves where a K = max step costs this many times a plain step (e.g. 3 5)",
    )
    parser.add_argument(
        "--noise-scale",
        type=float,
        default=1.0,
        help="scale the spread (in log) of the per-step noise factors within [1/2, 2] (see CostModel.noisier)",
    )
    parser.add_argument(
        "--compare-rev", default=None, help="also replay utility_policy.py of this git revision"
    )
    parser.add_argument(
        "--check-every", type=int, default=8, help="check drafts against lookup_ngram (0: off)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    fit = json.loads(Path(args.fit).read_text())
    if "benchmark" in fit:  # a results file: the record of --fit-setting
        fit = _records.records(args.fit, args.fit_setting)[-1]
    sizes = Sizes(**{**asdict(FULL), **fit["sizes"]})
    repeats = args.repeats or sizes.repeats
    max_k = max(*sizes.static_ks, sizes.utility_max_k)
    requests = build_requests(Path(args.shared) / "models", sizes, max_k, args.check_every)

    specs = dict(configurations(sizes))
    configs = {name: policy_factory(spec) for name, spec in specs.items() if spec is not None}
    baseline_policy = None
    if args.compare_rev:
        baseline_policy = f"utility@{git_commit(args.compare_rev) or args.compare_rev}"
        configs[baseline_policy] = policy_factory(specs["utility"], load_policy_class(args.compare_rev))
    costs, fits = {}, {}
    for name in MODELS:
        cost, fits[name] = fit_cost_model(fit, name, requests[name], max_k)
        fits[name]["noise_check"] = noise_check(fit, cost, args.noise_scale)
        cost = cost.noisier(args.noise_scale)
        costs[name] = (name, cost)
        for ratio in args.steep:
            steep = cost.steep(ratio)
            costs[steep.name] = (name, steep)
    seeds = list(range(args.seeds))
    result = {
        cost_name: {"model": model, **replay_cost_model(requests[model], cost, configs, seeds, repeats)}
        for cost_name, (model, cost) in costs.items()
    }
    out = {
        "machine": machine_info("cpu"),
        "commit": git_commit("HEAD"),
        "args": vars(args),
        "fit_source": f"{Path(args.fit).name}:{args.fit_setting}",
        "sizes": asdict(sizes),
        "repeats": repeats,
        "seeds": seeds,
        "cost_models": {
            name: {
                **asdict(cost),
                "noise": {
                    "count": len(cost.noise),
                    "quantiles_0_10_50_90_100": np.quantile(cost.noise, [0, 0.1, 0.5, 0.9, 1]).tolist(),
                },
            }
            for name, (_, cost) in costs.items()
        },  # fmt: skip
        "cost_fits": fits,
        "faithfulness": faithfulness(fit, requests, result, sizes, baseline_policy),
        "replay": result,
    }
    out["runtime_s"] = time.perf_counter() - t0
    lines = table_lines(result)
    for name, entry in fits.items():
        check = entry["noise_check"]
        lines.append(
            f"{name} step noise (std of log): traced at one K {check['traced_same_k_log_std']:.3f}, around the fit "
            f"{check['traced_residual_log_std']:.3f} (lag-1 autocorrelation "
            f"{check['traced_residual_lag1_autocorrelation']:.2f}); replayed {check['replay_log_std']:.3f} "
            f"(noise scale {args.noise_scale:g}) plus {check['replay_hiccups']:.1%} hiccups"
        )
    for name, entry in out["faithfulness"].items():
        for config, v in entry["static_acceptance"].items():
            lines.append(
                f"{name} {config}: mean acceptance length {v['mean_acceptance_length']:.2f} (H200 {v['h200']:.2f}), "
                f"requests with the H200 step count {v['requests_with_the_h200_step_count']}"
            )
        same = entry.get("replayed_same_policy_vs_best_static")
        if same:
            lines.append(
                f"{name}: H200 utility / best static {entry['h200_utility_vs_best_static']:.3f}; the same policy "
                f"replayed {same['mean']:.3f} ({same['min']:.3f}..{same['max']:.3f}, "
                f"{same['seeds_at_or_below_h200']}/{len(seeds)} seeds at or below)"
            )
    print("\n".join(lines))
    if not args.no_save:
        out = json.loads(json.dumps(out, default=lambda x: x.item()))  # numpy scalars
        path = _records.save(args, out, "cpu")
        suffix = "" if args.setting == "default" else f"_{args.setting}"
        print(
            f"wrote {plot(result, path.with_name(path.stem + suffix + '.png'))} in {out['runtime_s']:.0f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
