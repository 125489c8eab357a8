"""Quality of LOSSY sparse verification the way the field measures it: teacher-forced on held-out text, through the
engine's own verify path, against dense verification.

For each window of held-out text (a prompt and its true continuation) the continuation is fed to the target in
verify steps of ``window`` tokens, as the decoding loop runs them (`ModelRunner` with the setting's
`SparseVerifyState` step slot, the prompt prefilled densely first, every step's tokens kept: an oracle drafter whose
drafts are all accepted). Every position after the first is scored against the same position under dense
verification:

- ``delta_nll_pct``: the setting's mean NLL of the true tokens over dense's, in percent, with a paired bootstrap 95%
  interval over windows (``delta_nll_ci``; windows, not positions, are the independent units);
- ``top1``: share of positions where the setting's argmax is dense's;
- ``kl``: mean KL(dense || setting) in nats;
- ``flips_margin1``: positions where dense's top-2 logit margin is at least 1 and the argmax changed.

With ``free_running`` new tokens, each window's prompt is also generated freely (greedy, prompt lookup at K = 6,
dense and with the setting): ``accept_ratio`` is the setting's mean acceptance length over dense's, and
``copied_4gram_delta`` the change in the share of output 4-grams found in the prompt (a lossy mode that drifts into
copied text shows higher acceptance: a warning, not a win).

`grant` maps these (and the free-running measures a caller adds) to a precision class: ``near_exact`` and
``balanced`` have gates (`GATES`); a gate whose measure is missing is not passed, so a class is granted only on
evidence; ``fast`` is measured and reported, ungated.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from ..generation.engine.runner import ModelRunner
from ..generation.generate import generate
from ..integrations import Mode, speculation_mode
from ..sparse.config import LossySparseVerify
from ..sparse.state import SparseVerifyState
from ..step import Phase

#: a class's gates: (measure, comparison, bound). ``balanced``'s ``em_delta`` is in points of exact match
GATES: dict[str, tuple[tuple[str, str, float], ...]] = {
    "near_exact": (
        ("delta_nll_pct", "<=", 0.1),
        ("top1", ">=", 0.975),
        ("kl", "<=", 0.005),
        ("flips_margin1", "<=", 0),
    ),
    "balanced": (
        ("delta_nll_pct", "<=", 1.0),
        ("delta_nll_ci_high", "<=", 1.5),
        ("top1", ">=", 0.95),
        ("kl", "<=", 0.03),
        ("em_delta", ">=", -1.0),
        ("accept_ratio", ">=", 0.95),
        ("accept_ratio", "<=", 1.05),
    ),
}


@dataclass
class WindowScores:
    """Sums over the scored positions of one window."""

    positions: int = 0
    nll: float = 0.0  # the setting's (or dense's own) NLL of the true tokens
    nll_dense: float = 0.0
    top1: int = 0
    kl: float = 0.0
    flips_margin1: int = 0


@dataclass
class FreeRun:
    """One window's free-running generation with a setting and with dense verification."""

    acceptance: float
    acceptance_dense: float
    copied: float  # share of the output's 4-grams found in the prompt
    copied_dense: float


@dataclass
class Quality:
    """One setting's scores over every window (``windows``, and ``free`` where free-running was measured), and the
    aggregate measures."""

    windows: list[WindowScores] = field(default_factory=list)
    free: list[FreeRun] = field(default_factory=list)

    def summary(self, bootstrap: int = 2000, seed: int = 0) -> dict:
        positions = sum(w.positions for w in self.windows)
        nll = np.array([w.nll for w in self.windows])
        dense = np.array([w.nll_dense for w in self.windows])
        delta = 100.0 * (nll.sum() / dense.sum() - 1.0)
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(self.windows), size=(bootstrap, len(self.windows)))
        resampled = 100.0 * (nll[picks].sum(1) / dense[picks].sum(1) - 1.0)
        low, high = np.percentile(resampled, [2.5, 97.5])
        return dict(
            positions=positions,
            windows=len(self.windows),
            nll=float(nll.sum() / positions),
            nll_dense=float(dense.sum() / positions),
            delta_nll_pct=float(delta),
            delta_nll_ci=[float(low), float(high)],
            top1=sum(w.top1 for w in self.windows) / positions,
            kl=sum(w.kl for w in self.windows) / positions,
            flips_margin1=sum(w.flips_margin1 for w in self.windows),
            accept_ratio=(
                sum(f.acceptance for f in self.free) / sum(f.acceptance_dense for f in self.free)
                if self.free
                else None
            ),
            copied_4gram_delta=(
                sum(f.copied - f.copied_dense for f in self.free) / len(self.free) if self.free else None
            ),
        )


def grant(measures: dict) -> tuple[str, str]:
    """The highest class whose every gate is measured and met, and why the next one up was not granted."""
    values = dict(measures)
    ci = values.get("delta_nll_ci")
    if ci is not None:
        values["delta_nll_ci_high"] = ci[1]
    missing_or_failed = {}
    for name in ("near_exact", "balanced"):
        failed = []
        for measure, op, bound in GATES[name]:
            value = values.get(measure)
            if value is None:
                failed.append(f"{measure} not measured")
            elif not (value <= bound if op == "<=" else value >= bound):
                failed.append(f"{measure} {value:.4g} (needs {op} {bound})")
        missing_or_failed[name] = list(dict.fromkeys(failed))
    if not missing_or_failed["near_exact"]:
        return "near_exact", ""
    if not missing_or_failed["balanced"]:
        return "balanced", "near_exact: " + "; ".join(missing_or_failed["near_exact"])
    return "fast", "balanced: " + "; ".join(missing_or_failed["balanced"])


@torch.no_grad()
def verify_logprobs(
    model,
    prompt: torch.Tensor,
    continuation: torch.Tensor,
    setting: LossySparseVerify | None,
    calibration=None,
    window: int = 7,
) -> torch.Tensor:
    """Float32 log-probabilities ``[N - 1, V]`` of the tokens after ``continuation[0]`` (``N`` tokens), computed by
    verify steps of ``window`` true tokens after a dense prefill of ``prompt`` (1-D ids), with ``setting``'s
    sparsity (None: dense verification)."""
    device = model.get_input_embeddings().weight.device
    prompt, continuation = prompt.to(device), continuation.to(device)
    n, p = continuation.numel(), prompt.numel()
    mode = Mode(
        sparse_ffn=setting is not None and setting.ffn is not None,
        expert_skipping=setting is not None and setting.moe is not None,
    )
    out = []
    with speculation_mode(model, mode=mode) as switched:
        runner = ModelRunner(model, 1, p + n + window, device, "reference")
        runner.set_padding([0])
        runner.prefill(prompt[None])
        state = None
        if setting is not None:
            layers = model.config.get_text_config().num_hidden_layers
            state = SparseVerifyState(setting, layers, calibration, runner.cache.layer_devices(device))
            state.prefill(runner.cache, runner.pad_t, torch.full_like(runner.pad_t, p))
        # the prompt's last logits predicted continuation[0]; each step writes true tokens and predicts the next
        with switched.decoding_experts() if setting is not None else contextlib.nullcontext():
            for first in range(0, n - 1, window):
                chunk = continuation[first : min(first + window, n - 1)]
                start = torch.tensor([p + first], device=device)
                logits = runner.forward(
                    chunk[None], start, Phase.VERIFY, kv_len=p + first + chunk.numel(), verify_sparsity=state
                )
                out.append(torch.log_softmax(logits[0].float(), dim=-1))
    return torch.cat(out)


def copied_share(prompt: torch.Tensor, output: torch.Tensor, n: int = 4) -> float:
    """Share of ``output``'s ``n``-grams that occur in ``prompt`` (0 for an output shorter than ``n``)."""
    seen = {tuple(prompt[i : i + n].tolist()) for i in range(prompt.numel() - n + 1)}
    grams = [tuple(output[i : i + n].tolist()) for i in range(output.numel() - n + 1)]
    return sum(g in seen for g in grams) / len(grams) if grams else 0.0


@torch.no_grad()
def generate_freely(
    model, prompt: torch.Tensor, new_tokens: int, setting: LossySparseVerify | None, k: int = 6
):
    """Greedy generation with prompt lookup at K = ``k`` (dense verification, or ``setting``'s): ``(new token ids,
    mean acceptance length)``."""
    device = model.get_input_embeddings().weight.device
    speculation = dict(strategy="prompt_lookup", num_draft_tokens=k)
    if setting is not None:
        speculation["lossy_sparse_verify"] = setting.to_dict()
    out = model.generate(
        input_ids=prompt[None].to(device), max_new_tokens=new_tokens, do_sample=False, custom_generate=generate,
        speculation=speculation, return_dict_in_generate=True,
    )  # fmt: skip
    return out.sequences[0, prompt.numel() :].cpu(), out.speculation.mean_acceptance_length


def next_line_examples(
    texts: list[torch.Tensor], tokenizer, context: int, count: int, spacing: int = 256
) -> list[tuple[torch.Tensor, str]]:
    """Next-line completion examples (papers/000 Table 2's task on LCC): ``(prompt, line)`` with the prompt the
    ``context`` tokens before a line start (a token holding a newline ends it) and ``line`` the text of the line
    that follows, non-blank. Up to ``count`` examples, cut points at least ``spacing`` tokens apart, taken from each
    of ``texts`` (1-D ids) in turn."""
    cuts: list[list[tuple[torch.Tensor, str]]] = []
    for ids in texts:
        found, last = [], -spacing
        for p in range(context, ids.numel() - 1):
            if p - last < spacing or "\n" not in tokenizer.decode(ids[p - 1 : p]):
                continue
            line = tokenizer.decode(ids[p : p + 64]).split("\n")[0]
            if line.strip():
                found.append((ids[p - context : p], line))
                last = p
        cuts.append(found)
    examples = []
    for i in range(max((len(c) for c in cuts), default=0)):
        examples.extend(c[i] for c in cuts if i < len(c))
    return examples[:count]


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / the longer length (1.0 for two empty strings)."""
    if not a and not b:
        return 1.0
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1.0 - previous[-1] / max(len(a), len(b))


@torch.no_grad()
def next_line_task(
    model,
    tokenizer,
    examples: list[tuple[torch.Tensor, str]],
    settings: dict[str, LossySparseVerify | None],
    batch: int = 8,
    new_tokens: int = 40,
    k: int = 6,
    progress: bool = True,
) -> dict[str, dict]:
    """Exact match and edit similarity of the greedy next line (prompt lookup at K = ``k``; dense verification for a
    None setting, else the setting's), per setting: ``{"em", "edit_sim", "lines", "per_line": [(em, sim), ...]}``
    (EM in points, 0-100; the generated line is the text up to its first newline, both sides stripped)."""
    device = model.get_input_embeddings().weight.device
    out = {name: dict(per_line=[]) for name in settings}
    chunks = [examples[i : i + batch] for i in range(0, len(examples), batch)]
    for chunk in tqdm(chunks, desc="next-line task", disable=not progress):
        ids = torch.stack([prompt for prompt, _ in chunk]).to(device)
        for name, setting in settings.items():
            speculation = dict(strategy="prompt_lookup", num_draft_tokens=k)
            if setting is not None:
                speculation["lossy_sparse_verify"] = setting.to_dict()
            generated = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                custom_generate=generate, speculation=speculation,
            )  # fmt: skip
            for row, (_, line) in enumerate(chunk):
                text = tokenizer.decode(generated[row, ids.shape[1] :]).split("\n")[0].strip()
                out[name]["per_line"].append(
                    (float(text == line.strip()), edit_similarity(text, line.strip()))
                )
    for result in out.values():
        lines = result["per_line"]
        result.update(
            lines=len(lines),
            em=100.0 * sum(e for e, _ in lines) / max(len(lines), 1),
            edit_sim=100.0 * sum(s for _, s in lines) / max(len(lines), 1),
        )
    return out


def paired_delta(setting: list[float], dense: list[float], bootstrap: int = 2000, seed: int = 0) -> tuple:
    """Mean of ``setting - dense`` over paired items and its bootstrap 95% interval (same units as the items)."""
    diff = np.array(setting) - np.array(dense)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(bootstrap, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), [float(low), float(high)]


def score_window(dense: torch.Tensor, other: torch.Tensor, targets: torch.Tensor) -> WindowScores:
    """``other``'s log-probabilities ``[P, V]`` against ``dense``'s at the same positions, ``targets`` ``[P]`` the
    true tokens."""
    nll = -other.gather(1, targets[:, None]).squeeze(1)
    nll_dense = -dense.gather(1, targets[:, None]).squeeze(1)
    top_dense = dense.topk(2, dim=-1)
    argmax_other = other.argmax(-1)
    same = argmax_other == top_dense.indices[:, 0]
    margin = top_dense.values[:, 0] - top_dense.values[:, 1]  # log-probs differ from logits by a constant
    kl = (dense.exp() * (dense - other)).sum(-1).clamp_min(0)
    return WindowScores(
        positions=int(targets.numel()),
        nll=float(nll.sum()),
        nll_dense=float(nll_dense.sum()),
        top1=int(same.sum()),
        kl=float(kl.sum()),
        flips_margin1=int(((margin >= 1.0) & ~same).sum()),
    )


def teacher_forced(
    model,
    windows: list[tuple[torch.Tensor, torch.Tensor]],
    settings: dict[str, LossySparseVerify],
    calibration=None,
    window: int = 7,
    reference_model=None,
    progress: bool = True,
    free_running: int = 0,
) -> dict[str, Quality]:
    """`Quality` of every setting over ``windows`` (``(prompt, continuation)`` pairs of 1-D ids), each against dense
    verification of ``model``; with ``reference_model`` (the same weights in another dtype, say) also
    ``"noise_floor"``: ``model``'s dense verification scored against that model's (its own dense steps as the
    reference), the difference two faithful runs of the same maths show. ``free_running``: new tokens of the
    free-running measures (0: none)."""
    results = {name: Quality() for name in settings}
    if reference_model is not None:
        results["noise_floor"] = Quality()
    for prompt, continuation in tqdm(windows, desc="teacher-forced windows", disable=not progress):
        targets = continuation[1:].to(model.get_input_embeddings().weight.device)
        dense = verify_logprobs(model, prompt, continuation, None, window=window)
        for name, setting in settings.items():
            other = verify_logprobs(model, prompt, continuation, setting, calibration, window)
            results[name].windows.append(score_window(dense, other, targets))
        if reference_model is not None:
            reference = verify_logprobs(reference_model, prompt, continuation, None, window=window)
            results["noise_floor"].windows.append(score_window(reference.to(dense.device), dense, targets))
        if free_running:
            out_dense, acc_dense = generate_freely(model, prompt, free_running, None)
            copied_dense = copied_share(prompt, out_dense)
            for name, setting in settings.items():
                out, acc = generate_freely(model, prompt, free_running, setting)
                results[name].free.append(FreeRun(acc, acc_dense, copied_share(prompt, out), copied_dense))
    return results


def grade(
    model,
    windows: list[tuple[torch.Tensor, torch.Tensor]],
    candidates: dict[str, LossySparseVerify],
    calibration=None,
    window: int = 7,
    free_running: int = 0,
    progress: bool = True,
) -> list[dict]:
    """Each candidate's measured quality over ``windows`` (`teacher_forced`) and the class it earns (`grant`), as the
    ``grades`` of a `SparseCalibration`: ``{"name", "setting" (without its calibration), "class",
    "why_not_higher", "measures"}`` in the candidates' order (give them sparsest first: `SparseCalibration.granted`
    takes the first that qualifies)."""
    results = teacher_forced(
        model, windows, candidates, calibration, window, progress=progress, free_running=free_running
    )
    grades = []
    for name, setting in candidates.items():
        measures = results[name].summary()
        cls, why = grant(measures)
        fields = {k: v for k, v in setting.to_dict().items() if k != "calibration"}
        grades.append(
            dict(name=name, setting=fields, measures=measures, why_not_higher=why, **{"class": cls})
        )
    return grades
