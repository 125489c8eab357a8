"""Self-speculation in the long-context, KV-bound regime: per-iteration cost (draft / verify / update) of vegas,
streaming and quest against our own K = 0 step on the Llama-3.1-8B shape (random bf16 weights), acceptance on
the 16K-trained fixtures, and the projection that combines them; plain transformers ``generate`` beside it.

Three parts, each writing its own JSON (so they can run in separate device commands), and an ``assemble`` step
that joins them into the ``assembled`` record of ``benchmarks/results/long.json`` and draws ``long.png``:

    python benchmarks/bench_long.py acceptance --models models/ --out acc.json      # fixtures, GPU
    python benchmarks/bench_long.py speed --cases 16x16384 4x65536 --out speed.json   # 8B shape, GPU
    python benchmarks/bench_long.py speed --strategies k0 vegas vegas_int4 low_bit_int4 --cases 1x4096 --out lb.json
    python benchmarks/bench_long.py transformers --cases 1x16384 --out hf.json        # plain generate, GPU
    python benchmarks/bench_long.py assemble acc.json speed.json hf.json

Strategy names (speed) and acceptance variants ending in ``_int4`` / ``_int8`` draft with the target's low-bit copy
(issue 39): ``vegas_int4`` / ``streaming_int4`` run their draft steps on it over the target's cache,
``low_bit_int4`` is the ``low_bit`` strategy (the copy with a full KV cache of its own); speed records carry
``draft_weights`` (``"bf16"`` for the model's own) and ``draft_weight_bytes``.

Timings come from ``out.speculation`` of real ``generate`` calls (CUDA events around each stage of each step),
averaged over the steps that ran the case's K. ``capture_first_s`` is the graph capture of the first call of a
strategy (its session: K policy bound 8), ``capture_second_s`` that of the next call (another K, same session).
``syncs_per_step`` counts host synchronisations with ``torch.cuda.set_sync_debug_mode`` over two calls of
different lengths on the same shape and batch at a 1K context (setup and prefill cancel out).
``projected_speedup`` = acceptance length / iteration time over 1 / K = 0 step time: a projection from two
measurements (random weights accept almost nothing, so the acceptance comes from the trained fixtures at the same
K and context; at 32K / 64K, beyond the fixtures' 16K, the 16K acceptance is used and ``acceptance_context`` says
so).

Plain transformers: ``model.generate(do_sample=False)`` with SDPA and a DynamicCache. cuDNN builds an execution
plan for every new input shape, and every decode step of plain ``generate`` has a new KV length; the warm-up call
is therefore the timed call itself (same prompt, same number of new tokens), so the timed call finds every plan
built, and the per-token decode time is (T(N) - T(1)) / (N - 1) from two timed calls.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import hf_sparse_verify as hsv
from benchmarks import _records
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.shapes import random_model
from hf_sparse_verify.drivers.syncs import count_syncs
from hf_sparse_verify.generation.drafters.low_bit import (
    draft_weight_bytes,
    low_bit_draft_for,
    low_bit_linears,
)

SHAPE = "llama-3.1-8b"
CASES = ["1x16384", "4x32768", "16x16384", "4x65536", "32x8192"]
STRATEGIES = ["vegas", "streaming", "quest"]
#: extra strategies of the speed part: vegas with a given `SpeculationConfig.vegas_lse`
VEGAS_LSE = {"vegas_step": "step", "vegas_carried": "carried"}
KS = [4, 6, 8]
MAX_K = 8
RATIO, MIN_TOKENS = 0.07, 256


def _parse_case(case: str) -> tuple[int, int]:
    batch, context = case.lower().split("x")
    return int(batch), int(context)


#: strategy-name suffixes of the low-bit draft weights (issue 39): ``vegas_int4`` is Vegas drafting with the target's
#: int4 copy; ``low_bit_int4`` the low_bit strategy (the copy with its own full KV cache)
DRAFT_WEIGHTS = ("int4", "int8")


def _split_weights(name: str) -> tuple[str, str | None]:
    """``"vegas_int4"`` -> ``("vegas", "int4")``; a name without a low-bit suffix -> ``(name, None)``."""
    for weights in DRAFT_WEIGHTS:
        if name.endswith("_" + weights):
            return name[: -len(weights) - 1], weights
    return name, None


def _weight_fields(model, strategy: str) -> dict:
    """``draft_weights`` (``"bf16"``: the model's own) and ``draft_weight_bytes`` (the linear weights a draft step
    reads: the low-bit copy's packed weights and scales, or the model's own linear layers). Records of commit
    55537ad, which fell back to the model's own weights above `LowBitLinear.FASTER_ROWS`, also carry
    ``asked_draft_weights``."""
    _, weights = _split_weights(strategy)
    if weights is None:
        return dict(draft_weights="bf16", draft_weight_bytes=sum(m.weight.nbytes for _, m in low_bit_linears(model)))
    copy = low_bit_draft_for(model, weights, 128)  # the copy the call drafted with (kept per target)
    return dict(draft_weights=weights, draft_weight_bytes=draft_weight_bytes(copy))


def _speculation(strategy: str, k: int) -> dict:
    base, weights = _split_weights(strategy)
    if weights is not None:
        return dict(_speculation(base, k), draft_weights=weights, draft_weight_group=128)
    if strategy == "low_bit":
        return dict(strategy="low_bit", num_draft_tokens=k, max_draft_tokens=MAX_K, k_policy="constant")
    if strategy == "k0":
        return dict(strategy="prompt_lookup", k_policy="plain", max_draft_tokens=MAX_K)
    if strategy == "vegas_utility":  # Cascade's utility policy picks K (0 included) at every step
        return dict(
            strategy="vegas", k_policy="utility", max_draft_tokens=MAX_K, ratio=RATIO, min_tokens=MIN_TOKENS
        )
    if strategy in VEGAS_LSE:  # vegas with its weights normalised by each row's own lse or the carried one
        return dict(_speculation("vegas", k), vegas_lse=VEGAS_LSE[strategy])
    return dict(
        strategy=strategy, num_draft_tokens=k, max_draft_tokens=MAX_K, k_policy="constant", ratio=RATIO,
        min_tokens=MIN_TOKENS,
    )  # fmt: skip


def _generate(model, ids, new_tokens: int, speculation: dict):
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        custom_generate=hsv.generate,
        speculation=speculation,
        return_dict_in_generate=True,
    ).speculation


def _stage_ms(stats, k: int) -> dict:
    """Mean draft / verify / update ms over the steps that ran K = ``k`` (the last steps shorten K)."""
    parts = [p for p, kk in zip(stats.step_parts_s, stats.draft_tokens) if kk == k] or stats.step_parts_s
    mean = [1000 * sum(p[i] for p in parts) / len(parts) for i in range(3)]
    return dict(
        draft_ms=mean[0], verify_ms=mean[1], update_ms=mean[2], iteration_ms=sum(mean), steps=len(parts)
    )


def _count_syncs(fn) -> tuple[object, int]:
    result, count, _ = count_syncs(fn)
    return result, count


def _syncs_per_step(model, batch: int, strategy: str, k: int, vocab: int) -> float:
    ids = torch.randint(
        0, vocab, (batch, 1024), device="cuda", generator=torch.Generator("cuda").manual_seed(1)
    )
    spec = _speculation(strategy, k)
    _generate(model, ids, 8, spec)  # capture (kept in the session)
    long, n_long = _count_syncs(lambda: _generate(model, ids, 40, spec))
    short, n_short = _count_syncs(lambda: _generate(model, ids, 16, spec))
    return (n_long - n_short) / max(1, long.steps - short.steps)


def run_speed(args) -> dict:
    device = torch.device("cuda")
    model = random_model(SHAPE, device, torch.bfloat16)
    vocab = model.config.vocab_size
    hsv.set_graph_cache_size(1)
    records = []
    known = ["k0", *STRATEGIES, *VEGAS_LSE, "vegas_utility"]
    strategies = [s for s in known if s in args.strategies]
    strategies += [s for s in args.strategies if s not in known and _split_weights(s)[1] is not None]

    def ks_of(strategy: str) -> list[int]:
        return [0] if strategy in ("k0", "vegas_utility") else args.ks

    total = len(args.cases) * sum(len(ks_of(s)) for s in strategies)
    bar = tqdm(total=total, desc="bench_long speed", file=sys.stdout)
    for case in args.cases:
        batch, context = _parse_case(case)
        gen = torch.Generator("cuda").manual_seed(0)
        ids = torch.randint(0, vocab, (batch, context), device=device, generator=gen)
        for strategy in strategies:
            hsv.clear_graph_cache()
            ks = ks_of(strategy)
            captures = []
            cold = None
            if strategy == "vegas_utility":
                # the policy's first request on a model tests K > 0; later requests start from what it learnt (its
                # best K, or its back-off when speculation did not pay): the record is the second call, the first
                # is kept beside it
                cold = _generate(model, ids, args.new_tokens, _speculation(strategy, 0))
            for k in ks:
                begin = time.perf_counter()
                try:
                    stats = _generate(model, ids, args.new_tokens, _speculation(strategy, k))
                except torch.OutOfMemoryError as err:  # record it and go on with the next case
                    records.append(dict(shape=SHAPE, batch=batch, context=context, strategy=strategy, k=k,
                                        error=f"out of memory: {str(err)[:160]}"))  # fmt: skip
                    print(json.dumps(records[-1]), flush=True)
                    hsv.clear_graph_cache()
                    captures.append(None)
                    bar.update(1)
                    continue
                wall = time.perf_counter() - begin
                captures.append(stats.graph_capture_s)
                record = dict(
                    shape=SHAPE, batch=batch, context=context, strategy=strategy, k=k, new_tokens=args.new_tokens,
                    **_stage_ms(stats, k), **_weight_fields(model, strategy),
                    capture_s=stats.graph_capture_s, call_s=wall,
                    prefill_s=stats.prefill_time_s, allocated_gb=torch.cuda.memory_allocated() / 2**30,
                    decode_tokens_per_s=(sum(stats.new_tokens) - batch) / max(1e-9, sum(stats.step_times_s)),
                    mean_k=sum(stats.draft_tokens) / max(1, stats.steps),
                )  # fmt: skip
                if cold is not None:
                    record.update(
                        cold_call_decode_tokens_per_s=(sum(cold.new_tokens) - batch) / max(1e-9, sum(cold.step_times_s)),
                        cold_call_mean_k=sum(cold.draft_tokens) / max(1, cold.steps),
                    )  # fmt: skip
                records.append(record)
                bar.update(1)
                print(json.dumps(record), flush=True)
            first = next(
                r
                for r in records
                if r["batch"] == batch and r["context"] == context and r["strategy"] == strategy
            )
            first["capture_first_s"] = captures[0]
            first["capture_second_s"] = captures[1] if len(captures) > 1 else None
            Path(args.out).write_text(
                json.dumps(dict(machine=machine_info(device), part="speed", records=records))
            )
            if args.syncs:
                hsv.clear_graph_cache()
                syncs = _syncs_per_step(model, batch, strategy, 6 if strategy != "k0" else 0, vocab)
                for r in records:
                    if r["batch"] == batch and r["context"] == context and r["strategy"] == strategy:
                        r["syncs_per_step"] = syncs
                print(f"{case} {strategy}: {syncs:.3f} syncs per step", flush=True)
        hsv.clear_graph_cache()
    bar.close()
    return dict(machine=machine_info(device), part="speed", records=records)


def run_transformers(args) -> dict:
    device = torch.device("cuda")
    model = random_model(SHAPE, device, torch.bfloat16)
    vocab = model.config.vocab_size
    records = []
    for case in tqdm(args.cases, desc="plain generate", file=sys.stdout):
        batch, context = _parse_case(case)
        ids = torch.randint(
            0, vocab, (batch, context), device=device, generator=torch.Generator("cuda").manual_seed(0)
        )
        mask = torch.ones_like(ids)

        def call(n, ids=ids, mask=mask):
            torch.cuda.synchronize()
            begin = time.perf_counter()
            model.generate(
                input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n
            )
            torch.cuda.synchronize()
            return time.perf_counter() - begin

        call(args.new_tokens)  # warm-up: the very shapes of the timed call (cuDNN plans, allocator)
        full, one = call(args.new_tokens), call(1)
        step_ms = 1000 * (full - one) / (args.new_tokens - 1)
        records.append(dict(shape=SHAPE, batch=batch, context=context, strategy="transformers", k=0,
                            transformers_step_ms=step_ms, call_s=full, prefill_s=one))  # fmt: skip
        print(json.dumps(records[-1]), flush=True)
    return dict(machine=machine_info(device), part="transformers", records=records)


def run_acceptance(args) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder = Path(args.models)
    model = (
        AutoModelForCausalLM.from_pretrained(folder / "code-target", dtype=torch.float32).to(device).eval()
    )
    tok = AutoTokenizer.from_pretrained(folder / "code-target")
    prompts = [json.loads(line) for line in open(folder / "prompts_long.jsonl", encoding="utf-8")]
    variants = {
        # the default: softmax weights, first and last rows, 7/8 of the budget for recent tokens, the scores
        # max-pooled over 7 neighbouring slots before the top-k
        "vegas": {},
        "vegas_pool1": dict(vegas_pool=1),  # no pooling (the default before vegas_pool)
        "vegas_pool5": dict(vegas_pool=5),
        "vegas_pool9": dict(vegas_pool=9),
        "vegas_topk": dict(vegas_recent_share=0.0, vegas_pool=1),  # weights, plain top-k
        "vegas_logits": dict(vegas_scores="logits", vegas_recent_share=0.0, vegas_pool=1),  # an older default
        "vegas_all": dict(selection="all"),
        "vegas_step": dict(vegas_lse="step"),  # softmax weights normalised by each scored row's own lse
        "vegas_carried": dict(vegas_lse="carried"),  # ... by the previous verify step's last-row lse
        "vegas_all_carried": dict(selection="all", vegas_lse="carried"),
        "vegas_r75": dict(vegas_recent_share=0.75),
        "vegas_r875": dict(vegas_recent_share=0.875),
        "vegas_logits_r875": dict(vegas_scores="logits", vegas_recent_share=0.875, vegas_pool=1),
        "streaming": {},
        "quest": {},
        # low-bit draft weights (issue 39): the same strategies drafting with the target's rounded copy
        **{f"{name}_{w}": dict(draft_weights=w, draft_weight_group=128) for name in ("vegas", "streaming")
           for w in DRAFT_WEIGHTS},
        **{f"low_bit_{w}": {} for w in DRAFT_WEIGHTS},
    }
    variants = {name: v for name, v in variants.items() if name in args.variants}
    records = []
    jobs = [(c, v, k) for c in args.contexts for v in variants for k in args.ks]
    for context, variant, k in tqdm(jobs, desc="acceptance", file=sys.stdout):
        texts = [p["text"] for p in prompts if p["len"] >= context][: args.prompts]
        rows = [tok(t, return_tensors="pt").input_ids[0, :context] for t in texts]
        ids = torch.stack(rows).to(device)
        base, weights = _split_weights(variant)
        strategy = base if base == "low_bit" else variant.split("_")[0]
        spec = dict(_speculation(variant if base == "low_bit" else strategy, k), **variants[variant])
        stats = _generate(model, ids, args.new_tokens, spec)
        records.append(dict(model="code-target", context=context, variant=variant, strategy=strategy, k=k,
                            prompts=len(rows), new_tokens=args.new_tokens,
                            acceptance_length=stats.mean_acceptance_length))  # fmt: skip
        print(json.dumps(records[-1]), flush=True)
        hsv.clear_graph_cache()
    return dict(machine=machine_info(device), part="acceptance", records=records)


def assemble(args) -> dict:
    parts = {}
    machine = None
    sources = []
    for path in args.inputs:
        data = json.loads(Path(path).read_text())
        for r in data["records"]:
            r["commit"] = data["machine"]["commit"]
            r["run"] = Path(path).name  # one file = one device run
        parts.setdefault(data["part"], []).extend(data["records"])
        machine = machine or data["machine"]
        sources.append(dict(file=Path(path).name, part=data["part"], commit=data["machine"]["commit"],
                            date=data["machine"]["date"], gpu=data["machine"]["gpu"]))  # fmt: skip
    # ratios are side by side: each record is compared with the K = 0 step of its own run (file) where that run
    # timed one, else with the latest K = 0 step of its shape (``k0_run`` and ``k0_commit`` say which)
    k0_runs = {
        (r["batch"], r["context"], r["run"]): r for r in parts.get("speed", []) if r["strategy"] == "k0"
    }
    # later files win: a case measured twice keeps its last measurement; a sync count (measured per shape, batch
    # and strategy) missing from it comes from an earlier run of the same case
    speed, syncs = {}, {}
    for r in parts.get("speed", []):
        speed[(r["batch"], r["context"], r["strategy"], r["k"])] = r
        if r.get("syncs_per_step") is not None:
            syncs[(r["batch"], r["context"], r["strategy"])] = (r["syncs_per_step"], r["commit"])
    for (batch, context, strategy, _), r in speed.items():
        if r.get("syncs_per_step") is None and (batch, context, strategy) in syncs:
            r["syncs_per_step"], r["syncs_commit"] = syncs[(batch, context, strategy)]
    parts["speed"] = list(speed.values())
    acceptance = {
        (r["variant"], r["context"], r["k"]): r["acceptance_length"] for r in parts.get("acceptance", [])
    }
    # the library's default vegas setting is the variant the projection uses for strategy "vegas"
    variant_of = dict(
        vegas=args.vegas_variant, streaming="streaming", quest="quest", **{name: name for name in VEGAS_LSE},
        **{f"{n}_{w}": f"{n}_{w}" for n in ("vegas", "streaming", "low_bit") for w in DRAFT_WEIGHTS},
    )  # fmt: skip
    k0_latest = {(r["batch"], r["context"]): r for r in parts.get("speed", []) if r["strategy"] == "k0"}

    def k0_of(r: dict) -> dict | None:
        return k0_runs.get((r["batch"], r["context"], r["run"])) or k0_latest.get((r["batch"], r["context"]))

    plain = {(r["batch"], r["context"]): r["transformers_step_ms"] for r in parts.get("transformers", [])}
    fixture_contexts = sorted({c for _, c, _ in acceptance})
    records = []
    for r in parts.get("speed", []):
        key = (r["batch"], r["context"])
        base = k0_of(r)
        out = dict(
            r,
            k0_step_ms=base and base["iteration_ms"],
            k0_commit=base and base["commit"],
            k0_run=base and base["run"],
            transformers_step_ms=plain.get(key),
        )
        k0_rate = base and base.get("decode_tokens_per_s")
        if r["strategy"] == "vegas_utility" and r.get("decode_tokens_per_s") and k0_rate:
            out["utility_over_k0"] = r["decode_tokens_per_s"] / k0_rate  # measured, random weights
            if r.get("cold_call_decode_tokens_per_s"):
                out["utility_over_k0_cold_call"] = r["cold_call_decode_tokens_per_s"] / k0_rate
        if r["strategy"] in variant_of and fixture_contexts:
            at = max((c for c in fixture_contexts if c <= r["context"]), default=fixture_contexts[0])
            acc = acceptance.get((variant_of[r["strategy"]], at, r["k"]))
            out.update(acceptance_length=acc, acceptance_context=at)
            if acc is not None and out["k0_step_ms"]:
                out["projected_speedup"] = acc * out["k0_step_ms"] / r["iteration_ms"]
        records.append(out)
    result = dict(
        machine=machine,
        note=(
            "projected_speedup = acceptance_length (code-target fixture, same K, context <= the case's) / "
            "iteration_ms over 1 / k0_step_ms: a projection from measured parts, not an end-to-end speedup"
        ),
        vegas_acceptance_variant=args.vegas_variant,
        sources=sources,
        records=records,
        acceptance=parts.get("acceptance", []),
        transformers=parts.get("transformers", []),
    )
    # the record of setting "assembled" in the results file (machine: the speed parts'; each record keeps its commit)
    _records.add(args.out, {"setting": "assembled", **result}, benchmark="long")
    _plot(result, Path(args.out).with_suffix(".png"))
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [r for r in result["records"] if r.get("projected_speedup") is not None]
    cases = sorted({(r["batch"], r["context"]) for r in records}, key=lambda c: (c[1], c[0]))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / (len(STRATEGIES) * len(KS))
    for i, (strategy, k) in enumerate((s, k) for s in STRATEGIES for k in KS):
        ys = [next((r["projected_speedup"] for r in records if (r["batch"], r["context"]) == c
                    and r["strategy"] == strategy and r["k"] == k), 0) for c in cases]  # fmt: skip
        axes[0].bar([x + i * width for x in range(len(cases))], ys, width, label=f"{strategy} K={k}")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set_xticks([x + 0.4 for x in range(len(cases))], [f"{b}x{c // 1024}K" for b, c in cases])
    axes[0].set_ylabel("projected speedup over our K = 0")
    axes[0].set_title("Llama-3.1-8B shape, H200 (projection)")
    axes[0].set_ylim(0, 1.3 * max(r["projected_speedup"] for r in records))  # room for the legend
    axes[0].legend(fontsize=6, ncol=3, loc="upper center")
    # the latest measurement of each (variant, context) at K = 6, as the projections use
    latest = {
        (a["variant"], a["context"]): a["acceptance_length"] for a in result["acceptance"] if a["k"] == 6
    }
    variants = sorted({v for v, _ in latest})
    contexts = sorted({c for _, c in latest})
    for j, variant in enumerate(variants):
        ys = [latest.get((variant, c), 0) for c in contexts]
        step = 0.8 / max(1, len(variants))
        axes[1].bar([x + j * step for x in range(len(contexts))], ys, step, label=variant)
    axes[1].set_xticks([x + 0.4 for x in range(len(contexts))], [f"{c // 1024}K" for c in contexts])
    axes[1].set_ylim(4.5, 6.5)
    axes[1].set_ylabel("mean acceptance length (K = 6)")
    axes[1].set_title("code-target fixture, prompts_long")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


#: row order of the README table
_CASE_ORDER = ["1x16384", "4x32768", "4x65536", "16x16384", "32x8192"]
_STRATEGY_LABEL = {"k0": "K = 0", "vegas": "vegas", "vegas_step": "vegas (`vegas_lse=\"step\"`, the default)",
                   "vegas_carried": "vegas (`vegas_lse=\"carried\"`)", "streaming": "streaming", "quest": "quest",
                   "vegas_utility": "vegas, utility (warm call)"}  # fmt: skip


def table(args) -> str:
    """The README's markdown table of the assembled record of ``long.json``."""
    data = _records.records(args.input, "assembled")[-1]

    def num(x, digits=2):
        return "" if x is None else f"{x:.{digits}f}"

    def order(r):
        case = f"{r['batch']}x{r['context']}"
        rank = _CASE_ORDER.index(case) if case in _CASE_ORDER else len(_CASE_ORDER)
        return rank, r["batch"], r["context"], list(_STRATEGY_LABEL).index(r["strategy"]), r["k"]

    lines = [
        "| batch x context | strategy | K | draft | verify | update | iteration ms | K = 0 step | acceptance (fixture "
        "ctx) | projected (utility: tokens/s of K = 0) | syncs / step | capture 1st / 2nd call (s) | run |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(data["records"], key=order):
        if r.get("acceptance_length") is not None:
            acceptance = f"{r['acceptance_length']:.2f} ({r['acceptance_context'] // 1024}K)"
        else:
            acceptance = "-"
        if r["strategy"] == "vegas_utility":
            projected = (
                f"{r['utility_over_k0']:.3f} of K = 0 (cold call {r['utility_over_k0_cold_call']:.2f})"
            )
        elif r.get("projected_speedup") is not None:
            projected = f"**{r['projected_speedup']:.2f}**"
        else:
            projected = "-"
        first, second = r.get("capture_first_s"), r.get("capture_second_s")
        capture = "" if first is None else f"{first:.1f} / {'-' if second is None else f'{second:.1f}'}"
        cells = [
            f"{r['batch']} x {r['context'] // 1024}K", _STRATEGY_LABEL[r["strategy"]], str(r["k"]),
            num(r["draft_ms"]), num(r["verify_ms"]), num(r["update_ms"]), num(r["iteration_ms"]),
            num(r["k0_step_ms"]), acceptance, projected, num(r.get("syncs_per_step")), capture, r["commit"][:7],
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    speed = sub.add_parser("speed")
    speed.add_argument("--cases", nargs="+", default=CASES)
    speed.add_argument("--ks", nargs="+", type=int, default=KS)
    speed.add_argument("--new-tokens", type=int, default=24)
    speed.add_argument("--no-syncs", dest="syncs", action="store_false")
    speed.add_argument("--strategies", nargs="+", default=["k0", *STRATEGIES, "vegas_utility"])
    speed.add_argument("--out", required=True)
    hf = sub.add_parser("transformers")
    hf.add_argument("--cases", nargs="+", default=CASES)
    hf.add_argument("--new-tokens", type=int, default=16)
    hf.add_argument("--out", required=True)
    acc = sub.add_parser("acceptance")
    acc.add_argument("--models", required=True)
    acc.add_argument("--contexts", nargs="+", type=int, default=[8192, 16384])
    acc.add_argument("--ks", nargs="+", type=int, default=KS)
    acc.add_argument("--prompts", type=int, default=12)
    acc.add_argument(
        "--variants", nargs="+",
        default=["vegas", "vegas_pool1", "vegas_pool5", "vegas_pool9", "vegas_topk", "vegas_logits", "vegas_all",
                 "vegas_r75", "streaming", "quest"],
    )  # fmt: skip
    acc.add_argument("--new-tokens", type=int, default=128)
    acc.add_argument("--out", required=True)
    asm = sub.add_parser("assemble")
    asm.add_argument("inputs", nargs="+")
    asm.add_argument(
        "--out",
        default=str(_records.results_path("long")),
        help="results file (default benchmarks/results/long.json)",
    )
    asm.add_argument(
        "--vegas-variant", default="vegas", help="acceptance variant of the default vegas setting"
    )
    tab = sub.add_parser("table", help="print the README table of an assembled record")
    tab.add_argument("input", nargs="?", default=str(_records.results_path("long")))
    args = parser.parse_args()
    runner = dict(
        speed=run_speed,
        transformers=run_transformers,
        acceptance=run_acceptance,
        assemble=assemble,
        table=table,
    )
    result = runner[args.part](args)
    if args.part not in ("assemble", "table"):
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    with torch.no_grad():
        main()
