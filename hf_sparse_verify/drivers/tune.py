"""Three-step tuning of the ratio-based self-speculative strategies (``vegas``, ``streaming``, ``quest``).

The Vegas paper's §3.4: (1) sweep the sparsity ratio at a large K until the mean acceptance length stops
rising; (2) at that ratio, sweep K for tokens/s; (3) at that K, refine the ratio around the chosen one for
tokens/s. `three_step_search` is the search as a pure function of a measurement function; `measure_generate`
builds that function from a model and prompts; `tune` runs both and writes the results.

Example:
    >>> table = {0.05: 2.0, 0.1: 3.0, 0.2: 3.02}
    >>> def measure(ratio, k):
    ...     return Measurement(ratio, k, table.get(ratio, 3.0), 100.0 * k if k < 6 else 600.0 - k)
    >>> result = three_step_search(measure, ratios=[0.05, 0.1, 0.2], ks=[4, 6, 8], k_large=8)
    >>> result.ratio_step1, result.k
    (0.1, 6)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import SpeculationConfig
from ..registry import DRAFTERS, resolve

DEFAULT_RATIOS = (0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2)
DEFAULT_KS = (2, 3, 4, 5, 6, 8, 10, 12)
DEFAULT_K_LARGE = 8
REFINE_FACTORS = (0.5, 0.75, 1.25, 1.5)
MIN_GAIN = 0.02
STEP_NAMES = ("1_ratio_at_large_k", "2_k_at_ratio", "3_refine_ratio")
MEASUREMENTS_NAME = "tune_measurements.json"
PLOT_NAME = "tune_sweep.png"


def can_plot() -> bool:
    """Whether matplotlib is installed, so that `save_results` draws ``tune_sweep.png``."""
    return importlib.util.find_spec("matplotlib") is not None


def ratio_strategies() -> list[str]:
    """The registered strategies with a KV-selection ratio to tune (`Drafter.tunes_ratio`)."""
    return sorted(name for name in DRAFTERS if resolve(DRAFTERS, name).tunes_ratio)


@dataclass(frozen=True)
class Measurement:
    """One (ratio, K) point, aggregated over the sample prompts.

    Attributes:
        ratio / k: the configuration measured.
        mean_acceptance_length: 1 + accepted drafts / drafting events, summed over prompts (not a mean of means).
        tokens_per_second: decode throughput, the quantity steps 2 and 3 maximise.
        details: anything else the measurement function reports (counts, seconds, ...).
    """

    ratio: float
    k: int
    mean_acceptance_length: float
    tokens_per_second: float
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TuneResult:
    """What `three_step_search` found.

    Attributes:
        ratio_step1: where the acceptance stopped rising (step 1).
        k: the K with the best tokens/s at ``ratio_step1`` (step 2).
        ratio: the ratio with the best tokens/s at ``k`` (step 3): the tuned ratio.
        steps: per step name (`STEP_NAMES`), the measurements it looked at, in order (a point measured by an
            earlier step is reused, not re-run, and appears in both).
        k_large: the K of step 1.
    """

    ratio_step1: float
    k: int
    ratio: float
    steps: dict[str, list[Measurement]]
    k_large: int

    @property
    def best(self) -> Measurement:
        return max(self.steps[STEP_NAMES[2]], key=lambda m: m.tokens_per_second)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio_step1": self.ratio_step1,
            "k": self.k,
            "ratio": self.ratio,
            "k_large": self.k_large,
            "best": self.best.to_dict(),
            "steps": {name: [m.to_dict() for m in ms] for name, ms in self.steps.items()},
        }


def refine_candidates(ratio: float, factors: Iterable[float] = REFINE_FACTORS) -> list[float]:
    """Step 3's ratios: ``ratio`` and ``ratio * f`` for each factor, inside (0, 1], ascending, rounded to 6 digits.

    Example:
        >>> refine_candidates(0.1, (0.5, 1.5))
        [0.05, 0.1, 0.15]
    """
    out = {round(ratio, 6)}
    for f in factors:
        r = round(ratio * f, 6)
        if 0.0 < r <= 1.0:
            out.add(r)
    return sorted(out)


def three_step_search(
    measure: Callable[[float, int], Measurement],
    ratios: Sequence[float] = DEFAULT_RATIOS,
    ks: Sequence[int] = DEFAULT_KS,
    k_large: int = DEFAULT_K_LARGE,
    refine_factors: Sequence[float] = REFINE_FACTORS,
    min_gain: float = MIN_GAIN,
    progress=None,
) -> TuneResult:
    """The paper's three steps over a measurement function ``measure(ratio, k) -> Measurement``.

    1. Ratios in ascending order at ``k_large``; stop at the first ratio whose mean acceptance length gains less
       than ``min_gain`` (relative) over the previous one and keep the previous one; the largest ratio when the
       acceptance rises to the end.
    2. At that ratio, every K of ``ks``; keep the best tokens/s (ties: the smaller K).
    3. At that K, the ratio times each of ``refine_factors`` (`refine_candidates`); keep the best tokens/s.

    Each (ratio, K) is measured once. ``progress`` is an optional tqdm-like bar (``update``, ``total``,
    ``refresh``, ``set_postfix_str``); its total is set to the number of points still to measure.
    """
    if not ratios or not ks:
        raise ValueError("need at least one ratio and one K to sweep")
    bad = [r for r in ratios if not 0.0 < r <= 1.0]
    if bad:
        raise ValueError(f"ratios must be in (0, 1], got {bad}")
    if k_large < 1 or min(ks) < 1:
        raise ValueError(f"K values must be >= 1, got k_large={k_large}, ks={list(ks)}")
    ratios = sorted(set(ratios))
    ks = sorted(set(ks))
    cache: dict[tuple[float, int], Measurement] = {}

    def point(ratio: float, k: int, step: int) -> Measurement:
        key = (round(ratio, 6), k)
        if key not in cache:
            if progress is not None:
                progress.set_postfix_str(f"step {step}: ratio={ratio:g} K={k}")
            cache[key] = measure(ratio, k)
            if progress is not None:
                progress.update(1)
        return cache[key]

    def set_total(pending: int) -> None:
        if progress is not None:
            progress.total = progress.n + pending
            progress.refresh()

    set_total(len(ratios) + len(ks) + len(refine_factors))
    step1: list[Measurement] = []
    chosen_ratio = ratios[-1]
    for ratio in ratios:
        m = point(ratio, k_large, 1)
        if step1:
            previous = step1[-1].mean_acceptance_length
            gain = (m.mean_acceptance_length - previous) / previous if previous > 0 else float("inf")
            step1.append(m)
            if gain < min_gain:
                chosen_ratio = step1[-2].ratio
                break
        else:
            step1.append(m)

    set_total(sum((round(chosen_ratio, 6), k) not in cache for k in ks) + len(refine_factors))
    step2 = [point(chosen_ratio, k, 2) for k in ks]
    best_k = max(step2, key=lambda m: (m.tokens_per_second, -m.k)).k

    candidates = refine_candidates(chosen_ratio, refine_factors)
    set_total(sum((r, best_k) not in cache for r in candidates))
    step3 = [point(r, best_k, 3) for r in candidates]
    best_ratio = max(step3, key=lambda m: m.tokens_per_second).ratio
    return TuneResult(
        ratio_step1=chosen_ratio,
        k=best_k,
        ratio=best_ratio,
        steps=dict(zip(STEP_NAMES, (step1, step2, step3))),
        k_large=k_large,
    )


# ------------------------------------------------------------------------------------------- measuring with a model
def _sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def measure_generate(
    model,
    prompts: Sequence,
    base_config: SpeculationConfig,
    max_new_tokens: int,
    draft_model=None,
) -> Callable[[float, int], Measurement]:
    """A measurement function for `three_step_search`: greedy ``generate`` on each prompt, one by one (batch 1).

    Args:
        model: the target, on its device.
        prompts: ``[1, T]`` input-id tensors (on the model's device).
        base_config: every field but ``ratio`` and ``num_draft_tokens`` (raised ``max_draft_tokens`` if K needs it).
        max_new_tokens: new tokens per prompt.
        draft_model: passed through to ``generate``.

    The acceptance is summed over prompts (accepted drafts / drafting events); tokens/s is decode throughput:
    new tokens after the first / seconds after the prefill, summed over prompts (``wall_time_s`` minus
    ``prefill_time_s`` of the stats).
    """
    from ..generation import generate

    device = model.device

    def measure(ratio: float, k: int) -> Measurement:
        config = base_config.replace(
            ratio=ratio, num_draft_tokens=k, max_draft_tokens=max(base_config.max_draft_tokens, k)
        )
        accepted = events = new_tokens = 0
        decode_s = wall_s = 0.0
        for ids in prompts:
            _sync(device)
            start = time.perf_counter()
            out = model.generate(
                input_ids=ids,
                attention_mask=ids.new_ones(ids.shape),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                custom_generate=generate,
                speculation=config,
                draft_model=draft_model,
                return_dict_in_generate=True,
            )
            _sync(device)
            wall_s += time.perf_counter() - start
            stats = out.speculation
            for drafted, rows in zip(stats.draft_tokens, stats.accepted_tokens):
                if drafted > 0:
                    counted = [a for a in rows if a is not None]
                    accepted += sum(counted)
                    events += len(counted)
            new_tokens += max(0, stats.total_new_tokens - 1)
            decode_s += max(stats.wall_time_s - stats.prefill_time_s, 1e-9)
        return Measurement(
            ratio=ratio,
            k=k,
            mean_acceptance_length=1.0 + accepted / events if events else 1.0,
            tokens_per_second=new_tokens / decode_s,
            details={
                "accepted_drafts": accepted,
                "drafting_events": events,
                "decode_tokens": new_tokens,
                "decode_seconds": decode_s,
                "call_seconds": wall_s,
                "prompts": len(prompts),
            },
        )

    return measure


def read_prompts(path: str, prompt_len: int | None = None, max_prompts: int | None = None) -> list[str]:
    """Prompts from a text file (the whole file is one prompt) or a ``.jsonl`` with a ``"text"`` field per line
    (``prompt_len`` keeps only lines whose ``"len"`` equals it); at most ``max_prompts``."""
    with open(path, encoding="utf-8") as f:
        if path.endswith(".jsonl"):
            rows = [json.loads(line) for line in f if line.strip()]
            if prompt_len is not None:
                rows = [r for r in rows if r.get("len") == prompt_len]
            texts = [r["text"] for r in rows]
        else:
            if prompt_len is not None:
                raise ValueError("--prompt-len filters a .jsonl file's 'len' field; this is a text file")
            texts = [f.read()]
    if not texts:
        raise ValueError(f"no prompts in {path}" + (f" with len == {prompt_len}" if prompt_len else ""))
    return texts[:max_prompts] if max_prompts else texts


# ----------------------------------------------------------------------------------------------------- outputs
def plot_sweep(result: TuneResult, path: str, title: str = "") -> str:
    """Three panels: acceptance vs ratio (step 1), tokens/s vs K (step 2), tokens/s vs ratio (step 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    s1, s2, s3 = (result.steps[name] for name in STEP_NAMES)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [
        (
            axes[0],
            s1,
            "ratio",
            "mean_acceptance_length",
            result.ratio_step1,
            f"1: ratio at K={result.k_large}",
        ),
        (axes[1], s2, "k", "tokens_per_second", result.k, f"2: K at ratio={result.ratio_step1:g}"),
        (axes[2], s3, "ratio", "tokens_per_second", result.ratio, f"3: ratio at K={result.k}"),
    ]
    for ax, ms, x_name, y_name, chosen, label in panels:
        xs = [getattr(m, x_name) for m in ms]
        ys = [getattr(m, y_name) for m in ms]
        ax.plot(xs, ys, "o-", color="#2b6cb0")
        picked = [(x, y) for x, y in zip(xs, ys) if x == chosen]
        if picked:
            ax.plot(*picked[0], "o", ms=12, mfc="none", mec="#c53030", mew=2, label=f"chosen {chosen:g}")
            ax.legend(fontsize=8)
        if x_name == "ratio" and len(set(xs)) > 1 and max(xs) / min(xs) > 4:
            ax.set_xscale("log")
            ax.minorticks_off()
        if x_name == "ratio":
            ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))], fontsize=8)
        if x_name == "k":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("ratio" if x_name == "ratio" else "K (draft tokens)")
        ax.set_ylabel("mean acceptance length" if y_name == "mean_acceptance_length" else "decode tokens/s")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_results(
    result: TuneResult, config: SpeculationConfig, out_dir: str, meta: dict | None = None, title: str = ""
) -> dict[str, str]:
    """Write ``speculation_config.json``, ``tune_measurements.json`` and ``tune_sweep.png`` into ``out_dir`` (the
    plot only where matplotlib is installed: ``pip install hf-sparse-verify[bench]``; ``paths["plot"]`` is None
    otherwise)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"config": config.save_pretrained(out_dir)}
    paths["measurements"] = os.path.join(out_dir, MEASUREMENTS_NAME)
    with open(paths["measurements"], "w", encoding="utf-8") as f:
        json.dump({"meta": meta or {}, "config": config.to_dict(), **result.to_dict()}, f, indent=2)
        f.write("\n")
    paths["plot"] = plot_sweep(result, os.path.join(out_dir, PLOT_NAME), title) if can_plot() else None
    return paths


def tuned_config(base_config: SpeculationConfig, result: TuneResult) -> SpeculationConfig:
    """``base_config`` with the tuned ratio and K (``max_draft_tokens`` raised when K needs it)."""
    return base_config.replace(
        ratio=result.ratio,
        num_draft_tokens=result.k,
        max_draft_tokens=max(base_config.max_draft_tokens, result.k),
        k_policy="constant",
    )


def tune(
    model,
    tokenizer,
    prompts: Sequence[str],
    strategy: str = "vegas",
    *,
    max_new_tokens: int = 64,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    ks: Sequence[int] = DEFAULT_KS,
    k_large: int = DEFAULT_K_LARGE,
    refine_factors: Sequence[float] = REFINE_FACTORS,
    min_gain: float = MIN_GAIN,
    base_config: SpeculationConfig | dict | None = None,
    draft_model=None,
    warmup: bool = True,
    out_dir: str | None = None,
    meta: dict | None = None,
    show_progress: bool = True,
) -> tuple[SpeculationConfig, TuneResult]:
    """Tune ``ratio`` and K of a ratio-based strategy on ``prompts``; returns the tuned config and the search.

    Args:
        model / tokenizer: the target (on its device) and its tokenizer.
        prompts: texts, measured one by one (batch 1), greedy, ``max_new_tokens`` each.
        strategy: ``"vegas"``, ``"streaming"`` or ``"quest"``.
        ratios / ks / k_large / refine_factors / min_gain: see `three_step_search`.
        base_config: the other fields (``min_tokens``, ``selection``, ...); default ``SpeculationConfig()``.
        warmup: run one generate call first, outside the measurements.
        out_dir: when given, `save_results` writes the config, the measurements JSON and the PNG there.
    """
    from tqdm.auto import tqdm

    if strategy not in ratio_strategies():
        raise ValueError(f"tune sweeps the ratio of {ratio_strategies()}; got strategy {strategy!r}")
    user = (SpeculationConfig.coerce(base_config) or SpeculationConfig()).replace(
        strategy=strategy, k_policy="constant"
    )
    base = user.replace(max_draft_tokens=max(user.max_draft_tokens, k_large, *ks))
    device = model.device
    ids = [tokenizer(text, return_tensors="pt")["input_ids"].to(device) for text in prompts]
    measure = measure_generate(model, ids, base, max_new_tokens, draft_model=draft_model)
    if warmup:
        measure_generate(model, ids[:1], base, min(max_new_tokens, 8), draft_model=draft_model)(
            sorted(ratios)[0], k_large
        )
    with tqdm(desc=f"tune {strategy}", unit="point", disable=not show_progress) as bar:
        result = three_step_search(measure, ratios, ks, k_large, refine_factors, min_gain, progress=bar)
    config = tuned_config(user, result)
    if out_dir is not None:
        meta = {
            "strategy": strategy,
            "prompts": len(ids),
            "prompt_tokens": [int(i.shape[1]) for i in ids],
            "max_new_tokens": max_new_tokens,
            "min_gain": min_gain,
            **(meta or {}),
        }
        lengths = meta["prompt_tokens"]
        title = (
            f"{_short_name(meta.get('model'))} {strategy}: {len(ids)} prompt(s) of {min(lengths)}-{max(lengths)} "
            f"tokens, {max_new_tokens} new tokens, min_tokens={user.min_tokens}"
        )
        save_results(result, config, out_dir, meta, title=title)
    return config, result


def _short_name(path) -> str:
    if not path:
        return ""
    parts = [p for p in str(path).replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:])


def dense_warning(prompt_tokens: Sequence[int], ratios: Sequence[float], min_tokens: int) -> str | None:
    """A warning when ``min_tokens`` (or the prompt length) decides the budget for some swept ratios, so those
    ratios all measure the same thing."""
    shortest = min(prompt_tokens)
    flat = [r for r in sorted(ratios) if r * shortest < min_tokens]
    if not flat:
        return None
    return (
        f"ratios {flat} give fewer than min_tokens={min_tokens} tokens on the shortest prompt ({shortest} tokens): "
        f"the budget there is min_tokens (dense when the prompt is not longer), so these ratios measure the same; "
        f"lower --min-tokens or use longer prompts"
    )
