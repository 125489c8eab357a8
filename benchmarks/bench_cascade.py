"""Cascade benchmarks of the ``utility`` K policy: verify step cost vs K on MoE models, and end-to-end tokens/s
on a mixed workload.

Suites:
- ``steps``: one verify forward of K + 1 new tokens (K = 0..8) at batch 1 over a 1K-token context, through
  hf_sparse_verify's engine exactly as the loop runs it (the loop's `ModelRunner`: ``sparse_verify`` attention,
  a prefilled `SpecCache`, a ``verify`` `StepContext`, float32 logits; the same slots are overwritten each repeat)
  and through plain transformers (prefilled ``DynamicCache``, ``crop`` back to the context after each repeat,
  outside the timed region), for the ``code-moe`` fixture (held-out tokens) and a Qwen3-30B-A3B-shaped MoE with
  random bf16 weights (random tokens, default experts backend). Median of 10 repeats after 3 warm-ups, CUDA
  events on GPU. Also the unique experts touched per layer per step (one extra untimed forward with hooks on
  every ``mlp.gate``; with random weights routing is near uniform, so that count is an upper bound).
- ``e2e``: greedy ``generate`` on ``code-moe`` and ``code-target`` over three workloads: ``good`` (held-out code
  prompts of ``prompts.jsonl``, ``prompt_lookup`` drafts are good), ``poor`` (the same token ids shuffled) and
  ``random`` (uniform random ids); the mix is all of them. Configurations: plain ``model.generate``, our
  K = 0 path, static K, and ``utility``. One warm-up per configuration, then every prompt is timed
  ``--repeats`` times with the configurations interleaved. Tokens/s = total new tokens / total seconds.

Targets (issue 5): ``utility`` is never more than 5% slower than no speculation (the faster of plain generate
and our K = 0 path) on any workload, and on the mix at least as fast as the best static K.

    PYTHONPATH=. python benchmarks/bench_cascade.py --suite all   # record "all" of results/cascade.json
    PYTHONPATH=. python benchmarks/bench_cascade.py --quick --device cpu --json /tmp/cascade_quick.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, Qwen3MoeConfig

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_generate import _sync, machine_info
from hf_sparse_verify._compat import CACHE_KWARG
from hf_sparse_verify.drivers.shapes import SHAPES
from hf_sparse_verify.generation.engine.runner import ModelRunner
from hf_sparse_verify.integrations import speculation_mode
from hf_sparse_verify.step import Phase

ROOT = Path(__file__).resolve().parents[1]

QWEN3_30B_A3B = {
    **SHAPES["qwen3-30b-a3b"][1],
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
TINY_MOE = {
    **QWEN3_30B_A3B,
    "vocab_size": 2048,
    "hidden_size": 128,
    "intermediate_size": 256,
    "moe_intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the full (GPU) run and ``--quick``."""

    random_moe_name: str
    random_moe: dict
    step_context: int
    step_ks: tuple[int, ...]
    step_warmups: int
    step_repeats: int
    prompt_len_class: int  # prompts.jsonl windows of this length ...
    context: int  # ... tokenized and cut to this many tokens
    prompts_per_workload: int
    new_tokens: int
    static_ks: tuple[int, ...]
    utility_max_k: int
    repeats: int


FULL = Sizes(
    random_moe_name="qwen3-30b-a3b-shape-random",
    random_moe=QWEN3_30B_A3B,
    step_context=1024,
    step_ks=tuple(range(9)),
    step_warmups=3,
    step_repeats=10,
    prompt_len_class=1024,
    context=1024,
    prompts_per_workload=4,
    new_tokens=128,
    static_ks=(1, 2, 3, 4, 6, 8),  # 8 = utility_max_k: the best static K among all the policy may pick
    utility_max_k=8,
    repeats=1,
)
QUICK = Sizes(
    random_moe_name="tiny-qwen3-moe-random",
    random_moe=TINY_MOE,
    step_context=256,
    step_ks=(0, 1, 2, 4),
    step_warmups=1,
    step_repeats=3,
    prompt_len_class=512,
    context=256,
    prompts_per_workload=2,
    new_tokens=48,
    static_ks=(1, 2, 4),
    utility_max_k=8,
    repeats=1,
)
WORKLOADS = ("good", "poor", "random")
#: seconds per forward used only for the printed runtime estimate: (fixture step, 30B step) by device type
STEP_COST_S = {"cuda": (0.008, 0.07), "cpu": (0.02, 0.02)}


# ------------------------------------------------------------------------------------------------ step timing
def time_ms(fn, device: str, warmups: int, repeats: int, after=None) -> list[float]:
    """Milliseconds of ``fn()`` per repeat (CUDA events on GPU, host clock on CPU); ``after()`` runs untimed."""
    cuda = device.startswith("cuda")
    times = []
    for i in range(warmups + repeats):
        _sync(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = (time.perf_counter() - t0) * 1000.0
        if after is not None:
            after()
        if i >= warmups:
            times.append(ms)
    return times


def crop_to(cache, length: int) -> None:
    """Roll a transformers cache back to ``length`` tokens (a negative ``crop`` removes that many tokens, which
    every transformers 4.x/5.x release accepts)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def experts_per_layer(model, run) -> float | None:
    """Mean over MoE layers of the unique experts ``run()`` routes to; None for a model without ``mlp.gate``."""
    top_k = getattr(model.config, "num_experts_per_tok", None)
    counts: list[int] = []

    def hook(module, inputs, output):
        if isinstance(output, tuple) and len(output) == 3 and not output[2].is_floating_point():
            indices = output[2]  # [tokens, top_k] (transformers 5.17-5.23 Qwen3MoeTopKRouter)
        else:
            logits = output[0] if isinstance(output, tuple) else output
            indices = logits.reshape(-1, logits.shape[-1]).topk(top_k, dim=-1).indices
        counts.append(int(indices.unique().numel()))

    gates = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    handles = [g.register_forward_hook(hook) for g in gates]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return statistics.mean(counts) if counts else None


@torch.no_grad()
def step_sweep(
    name: str, model, ids: torch.Tensor, context: int, sizes: Sizes, args, bar, **extra
) -> list[dict]:
    """Ours vs transformers verify-forward time for each K; ``ids`` ``[1, context + max K + 1]``; ``extra`` is
    copied into every record."""
    device = args.device
    max_k = max(sizes.step_ks)
    assert ids.shape[1] >= context + max_k + 1, "need K + 1 tokens after the context"
    prompt = ids[:, :context]
    dyn_cache = DynamicCache(config=model.config)
    model(input_ids=prompt, **{CACHE_KWARG: dyn_cache}, use_cache=True, logits_to_keep=1)
    runner = ModelRunner(model, 1, context + max_k + 1, ids.device)  # the loop's SpecCache + StepContext
    zero, at = torch.zeros(1, dtype=torch.long, device=ids.device), torch.tensor([context], device=ids.device)
    with speculation_mode(model):
        runner.forward(prompt, zero, Phase.PREFILL, kv_len=context, logits_to_keep=1)
    records = []
    for k in sizes.step_ks:
        new = ids[:, context : context + k + 1]  # [1, K + 1]: pending token + K drafts

        def ours(new=new):
            runner.forward(
                new, at, Phase.VERIFY, kv_len=context + new.shape[1]
            )  # float32 logits [1, K + 1, V], as the loop gets them

        def theirs(new=new):
            model(input_ids=new, **{CACHE_KWARG: dyn_cache}, use_cache=True).logits.float()

        with speculation_mode(model):
            ours_ms = time_ms(ours, device, sizes.step_warmups, sizes.step_repeats)
            experts = experts_per_layer(model, ours)
        theirs_ms = time_ms(
            theirs, device, sizes.step_warmups, sizes.step_repeats, after=lambda: crop_to(dyn_cache, context)
        )
        records.append(
            {
                "model": name,
                "context": context,
                "k": k,
                "ours_ms": statistics.median(ours_ms),
                "transformers_ms": statistics.median(theirs_ms),
                "ours_ms_all": ours_ms,
                "transformers_ms_all": theirs_ms,
                "unique_experts_per_layer": experts,
                "num_experts": getattr(model.config, "num_experts", None),
                "top_k": getattr(model.config, "num_experts_per_tok", None),
                "experts_implementation": experts_backend(model),
                "parameters": sum(p.numel() for p in model.parameters()),
                **extra,
            }
        )
        bar.update(1)
    base = records[0]
    for r in records:
        r["ours_ratio_to_k0"] = r["ours_ms"] / base["ours_ms"]
        r["transformers_ratio_to_k0"] = r["transformers_ms"] / base["transformers_ms"]
        r["ours_over_transformers"] = r["ours_ms"] / r["transformers_ms"]
    return records


def experts_backend(model) -> str | None:
    getter = getattr(model, "get_experts_implementation", None)
    return getter().get("") if getter is not None else None


def random_moe(config_kwargs: dict, device: str, dtype) -> torch.nn.Module:
    config = Qwen3MoeConfig(**config_kwargs)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def suite_steps(args, sizes: Sizes, dtype, bar) -> list[dict]:
    shared = Path(args.shared) / "models"
    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    need = sizes.step_context + max(sizes.step_ks) + 1
    text = next(p["text"] for p in read_prompts(shared) if p["len"] >= 2 * sizes.step_context)
    ids = tok(text, return_tensors="pt").input_ids[:, :need].to(args.device)
    moe = AutoModelForCausalLM.from_pretrained(shared / "code-moe", dtype=dtype).to(args.device).eval()
    records = step_sweep("code-moe", moe, ids, sizes.step_context, sizes, args, bar)
    del moe
    t0 = time.perf_counter()
    big = random_moe(sizes.random_moe, args.device, dtype)
    _sync(args.device)
    init_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, sizes.random_moe["vocab_size"], (1, need), generator=gen).to(args.device)
    records += step_sweep(
        sizes.random_moe_name, big, ids, sizes.step_context, sizes, args, bar, init_s=init_s
    )
    del big
    free_memory(args.device)
    return records


def free_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ end to end
def read_prompts(shared: Path) -> list[dict]:
    with open(shared / "prompts.jsonl") as f:
        return [json.loads(line) for line in f]


def workloads(shared: Path, tok, sizes: Sizes, vocab_size: int) -> dict[str, list[torch.Tensor]]:
    """``good``: held-out prompts cut to ``sizes.context`` tokens; ``poor``: their ids shuffled; ``random``:
    uniform ids (special ids excluded). Each entry ``[1, context]`` on the CPU."""
    texts = [p["text"] for p in read_prompts(shared) if p["len"] == sizes.prompt_len_class]
    good = [tok(t, return_tensors="pt").input_ids[:, : sizes.context] for t in texts]
    good = good[: sizes.prompts_per_workload]
    if not good:
        raise ValueError(
            f"{shared / 'prompts.jsonl'} has no prompt of length class {sizes.prompt_len_class}: pass "
            "--prompt-len-class with one it has"
        )
    gen = torch.Generator().manual_seed(0)
    poor = [g[:, torch.randperm(g.shape[1], generator=gen)] for g in good]
    low = max(tok.all_special_ids, default=-1) + 1
    rand = [torch.randint(low, vocab_size, g.shape, generator=gen) for g in good]
    return {"good": good, "poor": poor, "random": rand}


#: the name `register_compare_policy` gives a second utility policy class (``--compare-policy``)
COMPARE = "utility_compare"


def register_compare_policy(path: str) -> None:
    """Register ``UtilityKPolicy`` of the file ``path`` (an older ``utility_policy.py``, e.g. from ``git show
    REV:hf_sparse_verify/generation/policies/utility_policy.py``) as the K policy `COMPARE`, imported beside the
    current one so its relative imports resolve: both policies are then timed side by side in one run."""
    from hf_sparse_verify.registry import K_POLICIES

    name = f"hf_sparse_verify.generation.policies._{COMPARE}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    K_POLICIES[COMPARE] = f"{name}:UtilityKPolicy"


def configurations(sizes: Sizes, compare: bool = False) -> list[tuple[str, dict | None]]:
    """(name, speculation dict); None is plain ``model.generate``. ``compare``: also `COMPARE` (registered by
    `register_compare_policy`) with the utility policy's settings."""
    configs: list[tuple[str, dict | None]] = [("plain_generate", None), ("k0_ours", dict(k_policy="plain"))]
    configs += [(f"static_k{k}", dict(strategy="prompt_lookup", num_draft_tokens=k)) for k in sizes.static_ks]
    policies = ("utility", COMPARE) if compare else ("utility",)
    configs += [
        (name, dict(strategy="prompt_lookup", k_policy=name, max_draft_tokens=sizes.utility_max_k))
        for name in policies
    ]
    return configs


def generate_once(model, ids: torch.Tensor, device: str, new_tokens: int, speculation: dict | None) -> dict:
    inputs = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids, device=device)}
    kwargs = {"max_new_tokens": new_tokens, "do_sample": False}
    if speculation is not None:
        kwargs.update(custom_generate=hsv.generate, speculation=speculation, return_dict_in_generate=True)
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(**inputs, **kwargs)
    _sync(device)
    seconds = time.perf_counter() - t0
    sequences = out.sequences if hasattr(out, "sequences") else out
    record = {
        "context": ids.shape[1],
        "seconds": seconds,
        "new_tokens": int(sequences.shape[1] - ids.shape[1]),
    }
    stats = getattr(out, "speculation", None)
    if stats is not None:
        drafting = [row[0] for k, row in zip(stats.draft_tokens, stats.accepted_tokens) if k > 0]  # batch 1
        record.update(
            steps=stats.steps,
            drafting_steps=len(drafting),
            accepted_drafts=sum(a for a in drafting if a is not None),
            mean_k=sum(stats.draft_tokens) / max(1, stats.steps),
            mean_acceptance_length=stats.mean_acceptance_length,
            stats=stats,
        )
    return record


def utility_trace(stats, baseline_steps: int = 4) -> dict:
    """Per step of one request: K drafted, K the policy issued, phase, the policy's last trial utility, step
    time, accepted drafts, and the step's own utility ``(1 + accepted) / (time / t0)`` with ``t0`` the median of
    the last ``baseline_steps`` plain steps before it (None for plain steps and before any plain step)."""
    states = stats.policy_states
    plain_times: list[float] = []
    step_utility: list[float | None] = []
    for i, time_s in enumerate(stats.step_times_s):
        issued = states[i]["k"] if i < len(states) else stats.draft_tokens[i]
        if issued == 0:
            plain_times = (plain_times + [time_s])[-baseline_steps:]
            step_utility.append(None)
            continue
        accepted = stats.accepted_tokens[i][0] or 0
        t0 = statistics.median(plain_times) if plain_times else None
        step_utility.append((1 + accepted) * t0 / time_s if t0 and time_s > 0 else None)
    return {
        "k": list(stats.draft_tokens),
        "issued_k": [s.get("k") for s in states],
        "phase": [s.get("phase") for s in states],
        "trial_utility": [s.get("utility") for s in states],
        "best_k": [s.get("best_k") for s in states],
        "set_steps": [s.get("set_steps") for s in states],
        "exit": [s.get("exit") for s in states],
        "accepted": [row[0] for row in stats.accepted_tokens],
        "step_times_s": list(stats.step_times_s),
        "step_utility": step_utility,
    }


def suite_e2e(args, sizes: Sizes, dtype, bar) -> tuple[list[dict], list[dict]]:
    shared = Path(args.shared) / "models"
    tok = AutoTokenizer.from_pretrained(shared / "code-target")
    records, traces = [], []
    for name in ("code-moe", "code-target"):
        model = AutoModelForCausalLM.from_pretrained(shared / name, dtype=dtype).to(args.device).eval()
        loads = workloads(shared, tok, sizes, model.config.vocab_size)
        configs = configurations(sizes, compare=args.compare_policy is not None)
        for _, spec in configs:  # one warm-up per configuration
            generate_once(model, loads["good"][0], args.device, sizes.new_tokens, spec)
            bar.update(1)
        for repeat in range(sizes.repeats):
            for workload in WORKLOADS:
                for p, ids in enumerate(loads[workload]):
                    for config, spec in configs:
                        r = generate_once(model, ids, args.device, sizes.new_tokens, spec)
                        stats = r.pop("stats", None)
                        if config == "utility" and p == 0 and repeat == sizes.repeats - 1:
                            traces.append({"model": name, "workload": workload, **utility_trace(stats)})
                        records.append(
                            {
                                "model": name,
                                "workload": workload,
                                "prompt": p,
                                "repeat": repeat,
                                "config": config,
                            }
                            | r
                        )
                        bar.update(1)
        del model
        free_memory(args.device)
    return records, traces


def summarize_e2e(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Per (model, workload incl. ``mix``, config): tokens/s, ratios, mean acceptance length; then the targets."""
    per_run: dict[tuple, list[dict]] = {}
    for r in records:
        per_run.setdefault((r["model"], r["workload"], r["prompt"], r["config"]), []).append(r)
    groups: dict[tuple, dict] = {}
    for (model, workload, _, config), runs in per_run.items():
        seconds = statistics.median(x["seconds"] for x in runs)  # median over repeats, per prompt
        last = runs[-1]
        for wl in (workload, "mix"):
            g = groups.setdefault(
                (model, wl, config), {"seconds": 0.0, "tokens": 0, "drafting": 0, "accepted": 0, "steps": 0}
            )
            g["seconds"] += seconds
            g["tokens"] += last["new_tokens"]
            g["drafting"] += last.get("drafting_steps", 0)
            g["accepted"] += last.get("accepted_drafts", 0)
            g["steps"] += last.get("steps", 0)
    rows = []
    for (model, wl, config), g in groups.items():
        tps = g["tokens"] / g["seconds"]
        plain = groups[(model, wl, "plain_generate")]
        k0 = groups.get((model, wl, "k0_ours"))
        rows.append(
            {
                "model": model,
                "workload": wl,
                "config": config,
                "tokens": g["tokens"],
                "seconds": g["seconds"],
                "tokens_per_s": tps,
                "ratio_to_plain": tps / (plain["tokens"] / plain["seconds"]),
                "ratio_to_k0": tps / (k0["tokens"] / k0["seconds"]) if k0 else None,
                "mean_acceptance_length": (1 + g["accepted"] / g["drafting"]) if g["drafting"] else None,
                "tokens_per_step": g["tokens"] / g["steps"] if g["steps"] else None,
            }
        )
    table = {(r["model"], r["workload"], r["config"]): r for r in rows}
    targets = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for wl in (*WORKLOADS, "mix"):
            u = table.get((model, wl, "utility"))
            if u is None:
                continue
            no_spec = max(table[(model, wl, c)]["tokens_per_s"] for c in ("plain_generate", "k0_ours"))
            targets.append(
                {
                    "model": model,
                    "workload": wl,
                    "target": "utility >= 0.95 x no speculation",
                    "ratio_to_plain": u["ratio_to_plain"],
                    "ratio_to_k0": u["ratio_to_k0"],
                    "ratio": u["tokens_per_s"] / no_spec,
                    "met": u["tokens_per_s"] >= 0.95 * no_spec,
                }
            )
        statics = [
            r
            for r in rows
            if r["model"] == model and r["workload"] == "mix" and r["config"][:8] == "static_k"
        ]
        u = table.get((model, "mix", "utility"))
        if statics and u is not None:
            best = max(statics, key=lambda r: r["tokens_per_s"])
            targets.append(
                {
                    "model": model,
                    "workload": "mix",
                    "target": f"utility >= best static K ({best['config']})",
                    "ratio": u["tokens_per_s"] / best["tokens_per_s"],
                    "met": u["tokens_per_s"] >= best["tokens_per_s"],
                }
            )
    return rows, targets


# ------------------------------------------------------------------------------------------------------ output
def step_table(steps: list[dict]) -> list[str]:
    models = list(dict.fromkeys(r["model"] for r in steps))
    by = {(r["model"], r["k"]): r for r in steps}
    first = {m: by[(m, min(r["k"] for r in steps if r["model"] == m))] for m in models}
    title = ", ".join(f"{m} ({first[m]['num_experts']} experts, top-{first[m]['top_k']})" for m in models)
    lines = [
        f"verify step vs K, batch 1, context {steps[0]['context']}: {title}",
        " K |"
        + "|".join(
            f" {'ours ms':>8} {'tf ms':>8} {'ours/K0':>7} {'tf/K0':>6} {'experts':>7} " for _ in models
        ),
    ]
    for k in sorted({r["k"] for r in steps}):
        cells = []
        for m in models:
            r = by.get((m, k))
            experts = r and r["unique_experts_per_layer"]
            cells.append(
                " " * 42
                if r is None
                else f" {r['ours_ms']:8.2f} {r['transformers_ms']:8.2f} {r['ours_ratio_to_k0']:7.2f} "
                f"{r['transformers_ratio_to_k0']:6.2f} {'-' if experts is None else f'{experts:.1f}':>7} "
            )
        lines.append(f"{k:2} |" + "|".join(cells))
    return lines


def e2e_table(rows: list[dict], targets: list[dict]) -> list[str]:
    by = {(r["model"], r["workload"], r["config"]): r for r in rows}
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        lines.append(f"{model}: tok/s (ratio to plain generate, mean acceptance length)")
        lines.append(f"  {'':14}" + "".join(f" {wl:>22}" for wl in (*WORKLOADS, "mix")))
        configs = list(dict.fromkeys(r["config"] for r in rows if r["model"] == model))
        for c in configs:
            cells = []
            for wl in (*WORKLOADS, "mix"):
                r = by[(model, wl, c)]
                mal = f"{r['mean_acceptance_length']:.2f}" if r["mean_acceptance_length"] else "  - "
                cells.append(f"{r['tokens_per_s']:7.1f} ({r['ratio_to_plain']:.2f},{mal})")
            lines.append(f"  {c:14}" + "".join(f" {x:>22}" for x in cells))
    for t in targets:
        extra = (
            f" [vs plain {t['ratio_to_plain']:.3f}, vs K=0 {t['ratio_to_k0']:.3f}]"
            if "ratio_to_plain" in t
            else ""
        )
        flag = "OK  " if t["met"] else "MISS"
        lines.append(f"{flag} {t['model']:11} {t['workload']:6} {t['target']}: {t['ratio']:.3f}{extra}")
    return lines


def estimate_seconds(sizes: Sizes, suite: str, device: str) -> float:
    fixture_s, big_s = STEP_COST_S["cuda" if device.startswith("cuda") else "cpu"]
    total = 0.0
    if suite in ("steps", "all"):
        forwards = len(sizes.step_ks) * (2 * (sizes.step_warmups + sizes.step_repeats) + 1)
        total += forwards * (fixture_s + big_s) + 15.0  # + random init, prefills
    if suite in ("e2e", "all"):
        configs = 3 + len(sizes.static_ks)
        runs = configs * (1 + sizes.repeats * len(WORKLOADS) * sizes.prompts_per_workload)
        total += 2 * runs * sizes.new_tokens * 0.75 * fixture_s  # ~0.75 forwards per token on average
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["steps", "e2e", "all"], default="all")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    _records.add_arguments(parser, "cascade")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke run (< 3 min)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per prompt (default 1)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per workload (default 4, quick 2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128, quick 48")
    parser.add_argument(
        "--prompt-len-class",
        type=int,
        default=None,
        help="prompts.jsonl windows of this length, cut to the context (default 1024, quick 512)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: 1 with --quick on CPU)"
    )
    parser.add_argument(
        "--compare-policy",
        default=None,
        help=f"also time the UtilityKPolicy of this file (an older utility_policy.py) as {COMPARE!r}, side by side",
    )
    args = parser.parse_args()
    if args.compare_policy is not None:
        register_compare_policy(args.compare_policy)
    sizes = QUICK if args.quick else FULL
    overrides = {
        "repeats": args.repeats,
        "prompts_per_workload": args.prompts,
        "new_tokens": args.new_tokens,
        "prompt_len_class": args.prompt_len_class,
    }
    sizes = Sizes(**{**asdict(sizes), **{k: v for k, v in overrides.items() if v is not None}})
    if args.device == "cpu" and (args.threads or args.quick):
        torch.set_num_threads(args.threads or 1)
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    )
    estimate = estimate_seconds(sizes, args.suite, args.device)
    print(
        f"bench_cascade: suite={args.suite} device={args.device} dtype={dtype} quick={args.quick}; "
        f"expected runtime ~{estimate / 60:.1f} min",
        flush=True,
    )

    cases = 0
    if args.suite in ("steps", "all"):
        cases += 2 * len(sizes.step_ks)
    if args.suite in ("e2e", "all"):
        n_configs = len(configurations(sizes, compare=args.compare_policy is not None))
        cases += 2 * n_configs * (1 + sizes.repeats * len(WORKLOADS) * sizes.prompts_per_workload)
    result = {
        "machine": machine_info(args.device),
        "args": vars(args),
        "sizes": asdict(sizes),
        "dtype": str(dtype),
    }
    t0 = time.perf_counter()
    with tqdm(total=cases, desc="cascade", mininterval=5.0) as bar:
        if args.suite in ("steps", "all"):
            result["steps"] = suite_steps(args, sizes, dtype, bar)
            _records.save(
                args, result, args.device, setting=args.suite
            )  # kept if the e2e suite does not finish
        if args.suite in ("e2e", "all"):
            records, traces = suite_e2e(args, sizes, dtype, bar)
            rows, targets = summarize_e2e(records)
            result.update(e2e_records=records, e2e=rows, targets=targets, traces=traces)
    result["runtime_s"] = time.perf_counter() - t0
    _records.save(args, result, args.device, setting=args.suite)
    lines = [f"wrote {args.json} in {result['runtime_s']:.0f} s (estimate {estimate:.0f} s)"]
    if "steps" in result:
        lines += step_table(result["steps"])
    if "e2e" in result:
        lines += e2e_table(result["e2e"], result["targets"])
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
