"""Vegas and its baselines: acceptance per draft position on the trained fixture, tokens/s side by side.

Suites:
- ``acceptance``: ``code-target`` (float32 on CPU, bf16 on GPU) on held-out prompts of ``prompts.jsonl`` at 1K, 2K,
  4K and 8K tokens, ``--prompts-per-length`` prompts each (default 4, one batch per length: the prompts of a length
  have exactly that many tokens, and the counts equal those of one-by-one calls, see `position_counts`), greedy,
  ratio 0.07, min_tokens 256, K in {4, 6, 8}: mean acceptance length and acceptance probability per draft position
  (accepted at position i / drafts that reached position i, the paper's Fig. 4) over the drafting steps of the
  first 64 new tokens, of ``vegas`` (two rows), ``vegas`` ``selection="all"``, ``selection="last_token"``,
  ``streaming`` and ``quest``. Counts are summed over prompts before dividing. Every output is also compared with
  plain greedy ``generate``.
- ``speed``: decode tokens/s of ``vegas`` vs ``streaming`` vs our K = 0 path (``k_policy="plain"``) vs plain
  ``model.generate``, side by side, (a) on the fixture at 4K and 8K (K = 6, 128 new tokens) and (b) on the
  Llama-3.1-8B shape with random bf16 weights at 32K and 64K (K = 4, 32 new tokens; acceptance there comes from
  random weights and means nothing). Per-step draft and verify times come from the stats; the iteration time is
  the decode wall time per step. "Selection + collection overhead" is ``(vegas - streaming) / vegas`` per-step
  time at the same K and budget: ``streaming`` collects no scores and selects with a cheap index rule, so the
  difference is score collection in the verify pass, top-k selection after it and any cost of attending to a
  scattered rather than a contiguous set; it also carries any difference in step mix between the two runs.

Decode tokens/s = (new tokens - 1) / (wall time of the call - wall time of the same call with one new token),
measured the same way for plain ``generate`` and ours, with no streamer attached (transformers' loop takes a slower
path with a streamer, which an earlier version of this script used and which penalised plain ``generate``). One
warm-up per (model, case), at the first context; JSON with the machine, versions and commit; a table last.

    PYTHONPATH=. python benchmarks/bench_vegas.py --suite all --device cuda   # record "all" of results/vegas.json
    PYTHONPATH=. python benchmarks/bench_vegas.py --suite all --device cpu --quick --json /tmp/quick_vegas.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.bench_generate import LLAMA_8B, ROOT, machine_info, random_model
from hf_sparse_verify.generation.drafters.self_spec.selection import budget

#: name -> SpeculationConfig fields of the strategies compared
STRATEGIES: dict[str, dict] = {
    "vegas": dict(strategy="vegas", selection="two_rows"),
    "vegas_all": dict(strategy="vegas", selection="all"),
    "vegas_last_token": dict(strategy="vegas", selection="last_token"),
    "streaming": dict(strategy="streaming"),
    "quest": dict(strategy="quest"),
}
TINY_LLAMA = dict(
    LLAMA_8B,
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
#: defaults of ``--quick``: a CPU smoke run of every code path in about a minute
QUICK = dict(
    lengths=[1024, 2048],
    prompts_per_length=1,
    ks=[4],
    new_tokens=24,
    speed_lengths=[1024],
    speed_prompts=1,
    speed_new_tokens=24,
    big_contexts=[2048],
    big_new_tokens=24,
)
RANDOM_NOTE = "random weights: acceptance means nothing, only step times do"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _call(model, ids, device: str, new_tokens: int, speculation: dict | None):
    kwargs = dict(max_new_tokens=new_tokens, do_sample=False)
    if speculation is not None:
        kwargs.update(custom_generate=hsv.generate, speculation=speculation, return_dict_in_generate=True)
    _sync(device)
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    _sync(device)
    return time.perf_counter() - start, out


def timed_call(model, ids, device: str, new_tokens: int, speculation: dict | None) -> tuple[dict, object]:
    """One greedy call, batch 1: wall time, decode time and, for ours, the stats.

    No streamer is attached (transformers' own loop takes a slower path when one is). Decode time = wall time of
    the call minus the wall time of the same call with ``max_new_tokens=1`` (prefill and set-up), measured the same
    way for plain ``generate`` and for ours.
    """
    seconds, out = _call(model, ids, device, new_tokens, speculation)
    first_s, _ = _call(model, ids, device, 1, speculation)
    sequences = out.sequences if hasattr(out, "sequences") else out
    produced = int(sequences.shape[1] - ids.shape[1])
    decode_s = max(seconds - first_s, 1e-9)
    record = {
        "new_tokens": produced,
        "seconds": seconds,
        "decode_seconds": decode_s,
        "tokens_per_s": produced / seconds,
        "decode_tokens_per_s": (produced - 1) / decode_s if produced > 1 else 0.0,
    }
    return record, out


# ------------------------------------------------------------------------------------------------- acceptance
def position_counts(stats, limit: int) -> tuple[list[int], list[int]]:
    """Per draft position i: drafts that reached i and drafts accepted at i (counts, so they add up over calls and
    rows), from ``draft_tokens`` and ``accepted_tokens``.

    Only steps that start before the row has ``limit`` new tokens are counted. The call runs ``limit + K + 1`` new
    tokens, so no counted step is shortened or cut by the length limit, and a batched call counts exactly what
    calls with one prompt each would (each row's drafting is independent of the other rows until that point).
    """
    reached: list[int] = []
    accepted: list[int] = []
    generated: list[int] | None = None
    for k, rows in zip(stats.draft_tokens, stats.accepted_tokens):
        if generated is None:
            generated = [1] * len(rows)  # the prefill's token
        for b, a in enumerate(rows):
            if a is None:
                continue
            if k > 0 and generated[b] < limit:
                if len(reached) < k:
                    reached += [0] * (k - len(reached))
                    accepted += [0] * (k - len(accepted))
                for i in range(k):
                    reached[i] += 1
                    accepted[i] += int(a > i)
            generated[b] += a + 1
    return reached, accepted


def _fixture(args, device: str, dtype):
    shared = Path(args.shared) / "models"
    model = AutoModelForCausalLM.from_pretrained(shared / "code-target", dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(shared / "code-target")
    tokenizer.padding_side = "left"
    prompts = [json.loads(line) for line in open(shared / "prompts.jsonl")]
    return model, tokenizer, prompts


def _texts(prompts, length: int, count: int) -> list[str]:
    texts = [p["text"] for p in prompts if p["len"] == length][:count]
    if not texts:
        raise SystemExit(f"prompts.jsonl has no prompt of len {length}")
    return texts


def _prompt_ids(tokenizer, prompts, length: int, count: int, device: str) -> list[torch.Tensor]:
    return [tokenizer(t, return_tensors="pt")["input_ids"].to(device) for t in _texts(prompts, length, count)]


def _batches(tokenizer, texts: list[str], size: int, device: str) -> list[dict]:
    size = size or len(texts)
    return [
        tokenizer(texts[i : i + size], return_tensors="pt", padding=True).to(device)
        for i in range(0, len(texts), size)
    ]


def suite_acceptance(args, device: str, dtype) -> list[dict]:
    model, tokenizer, prompts = _fixture(args, device, dtype)
    batches = {
        L: _batches(tokenizer, _texts(prompts, L, args.prompts_per_length), args.acceptance_batch, device)
        for L in args.lengths
    }
    jobs = [(L, name, k) for L in args.lengths for name in args.strategies for k in args.ks]
    total = sum(len(batches[L]) for L, _, _ in jobs) + sum(len(v) for v in batches.values())
    run_tokens = args.new_tokens + max(args.ks) + 1
    records = []
    with tqdm(total=total, desc="acceptance", file=sys.stdout) as bar:
        warm = batches[args.lengths[0]][0]
        spec = dict(STRATEGIES["vegas"], num_draft_tokens=4, attention_backend=args.attention_backend)
        model.generate(
            **warm, max_new_tokens=8, do_sample=False, custom_generate=hsv.generate, speculation=spec
        )
        plain = {}
        for L, inputs_list in batches.items():
            for i, inputs in enumerate(inputs_list):
                plain[L, i] = model.generate(**inputs, max_new_tokens=args.new_tokens, do_sample=False)
                bar.update(1)
        for L, name, k in jobs:
            speculation = dict(
                STRATEGIES[name],
                num_draft_tokens=k,
                ratio=args.ratio,
                min_tokens=args.min_tokens,
                attention_backend=args.attention_backend,
            )
            reached: list[int] = []
            accepted: list[int] = []
            per_call = []
            seconds = 0.0
            identical = rows = 0
            for i, inputs in enumerate(batches[L]):
                bar.set_postfix_str(f"{L} {name} K={k}")
                _sync(device)
                start = time.perf_counter()
                out = model.generate(
                    **inputs,
                    max_new_tokens=run_tokens,
                    do_sample=False,
                    custom_generate=hsv.generate,
                    speculation=speculation,
                    return_dict_in_generate=True,
                )
                _sync(device)
                seconds += time.perf_counter() - start
                r, a = position_counts(out.speculation, args.new_tokens)
                reached = [x + y for x, y in _zip_pad(reached, r)]
                accepted = [x + y for x, y in _zip_pad(accepted, a)]
                per_call.append({"rows": int(inputs["input_ids"].shape[0]), "steps": out.speculation.steps})
                expected = plain[L, i]
                ours = out.sequences[:, : expected.shape[1]]
                identical += int((ours == expected).all(dim=1).sum())
                rows += int(expected.shape[0])
                bar.update(1)
            events = reached[0] if reached else 0
            context = int(batches[L][0]["input_ids"].shape[1])
            records.append(
                {
                    "model": "code-target",
                    "prompt_len_class": L,
                    "context": context,
                    "strategy": name,
                    "k": k,
                    "ratio": args.ratio,
                    "min_tokens": args.min_tokens,
                    "budget_tokens_at_start": budget(context, args.ratio, args.min_tokens),
                    "prompts": rows,
                    "counted_new_tokens": args.new_tokens,
                    "drafting_events": events,
                    "accepted_drafts": sum(accepted),
                    "reached_per_position": reached,
                    "accepted_per_position": accepted,
                    "mean_acceptance_length": 1.0 + sum(accepted) / events if events else 1.0,
                    "acceptance_per_position": [a / r if r else 0.0 for a, r in zip(accepted, reached)],
                    "calls": per_call,
                    "identical_to_plain": identical,
                    "seconds": seconds,
                }
            )
    return records


def _zip_pad(a: list[int], b: list[int]):
    n = max(len(a), len(b))
    return zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))


# ------------------------------------------------------------------------------------------------------ speed
def speed_cases(k: int, args) -> dict[str, dict | None]:
    sparse = dict(num_draft_tokens=k, ratio=args.ratio, min_tokens=args.min_tokens)
    sparse["attention_backend"] = args.attention_backend
    return {
        "plain_generate": None,
        "k0_plain_policy": dict(k_policy="plain", attention_backend=args.attention_backend),
        f"vegas_k{k}": dict(STRATEGIES["vegas"], **sparse),
        f"streaming_k{k}": dict(STRATEGIES["streaming"], **sparse),
    }


def _speed_record(case: str, call: dict, out, plain_out) -> dict:
    record = {"case": case, **call}
    sequences = out.sequences if hasattr(out, "sequences") else out
    record["identical_to_plain"] = bool(
        sequences.shape == plain_out.shape and torch.equal(sequences, plain_out)
    )
    stats = getattr(out, "speculation", None)
    if stats is not None and stats.steps:
        steps = stats.steps
        record.update(
            steps=steps,
            mean_acceptance_length=stats.mean_acceptance_length,
            draft_ms_per_step=1e3 * stats.draft_time_s / steps,
            verify_ms_per_step=1e3 * stats.verify_time_s / steps,
            timed_ms_per_step=1e3 * (stats.draft_time_s + stats.verify_time_s) / steps,
            iteration_ms=1e3 * call["decode_seconds"] / steps,
            prefill_s=stats.prefill_time_s,
        )
        # what the stats' step timers leave out: the drafter's on_verify (selection), readback, bookkeeping
        record["other_ms_per_step"] = record["iteration_ms"] - record["timed_ms_per_step"]
    else:
        record.update(
            steps=call["new_tokens"],
            iteration_ms=1e3 * call["decode_seconds"] / max(1, call["new_tokens"] - 1),
        )
    return record


def _measure_context(model, model_name, contexts, inputs_for, cases, device, new_tokens, bar, note=None):
    records = []
    warmed: set[str] = set()
    for context in contexts:
        for p, ids in enumerate(inputs_for(context)):
            plain_out = None
            for case, speculation in cases.items():
                bar.set_postfix_str(f"{model_name} {context} {case}")
                if case not in warmed:
                    timed_call(model, ids, device, min(new_tokens, 16), speculation)
                    warmed.add(case)
                call, out = timed_call(model, ids, device, new_tokens, speculation)
                if plain_out is None:
                    plain_out = out
                record = _speed_record(case, call, out, plain_out)
                record.update(model=model_name, context=int(ids.shape[1]), prompt=p)
                if note:
                    record["note"] = note
                records.append(record)
                bar.update(1)
    return records


def suite_speed(args, device: str, dtype) -> list[dict]:
    records = []
    model, tokenizer, prompts = _fixture(args, device, dtype)
    fixture_cases = speed_cases(args.speed_k, args)
    big_cases = speed_cases(args.big_k, args)
    total = len(args.speed_lengths) * args.speed_prompts * len(fixture_cases) + len(args.big_contexts) * len(
        big_cases
    )
    with tqdm(total=total, desc="speed", file=sys.stdout) as bar:
        records += _measure_context(
            model,
            "code-target",
            args.speed_lengths,
            lambda L: _prompt_ids(tokenizer, prompts, L, args.speed_prompts, device),
            fixture_cases,
            device,
            args.speed_new_tokens,
            bar,
        )
        del model
        big_config, big_name = (
            (TINY_LLAMA, "tiny-llama-random") if args.quick else (LLAMA_8B, "llama-3.1-8b-shape")
        )
        big_dtype = dtype if args.quick else (torch.bfloat16 if device != "cpu" else dtype)
        big = random_model(big_config, device, big_dtype)
        gen = torch.Generator().manual_seed(0)

        def random_prompt(context: int) -> list[torch.Tensor]:
            return [torch.randint(3, big_config["vocab_size"], (1, context), generator=gen).to(device)]

        records += _measure_context(
            big,
            f"{big_name}-{str(big_dtype).removeprefix('torch.')}",
            args.big_contexts,
            random_prompt,
            big_cases,
            device,
            args.big_new_tokens,
            bar,
            note=RANDOM_NOTE,
        )
        del big
    return records


# ---------------------------------------------------------------------------------------------------- summary
def speed_summary(records: list[dict]) -> list[dict]:
    """Per (model, context, case): medians over prompts, the ratio to plain generate, and for vegas the overhead
    vs streaming at the same K (whole iteration, and split into verify / draft / untimed parts)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["model"], r["context"], r["case"]), []).append(r)
    rows = []
    for (model, context, case), rs in groups.items():
        row = {"model": model, "context": context, "case": case, "prompts": len(rs)}
        for key in rs[0]:
            if isinstance(rs[0][key], (int, float)) and not isinstance(rs[0][key], bool) and key != "prompt":
                row[key] = statistics.median(r[key] for r in rs)
        row["identical_to_plain"] = sum(r["identical_to_plain"] for r in rs)
        if rs[0].get("note"):
            row["note"] = rs[0]["note"]
        rows.append(row)
    index = {(r["model"], r["context"], r["case"]): r for r in rows}
    for row in rows:
        plain = index.get((row["model"], row["context"], "plain_generate"))
        if plain:
            row["decode_ratio_to_plain"] = row["decode_tokens_per_s"] / plain["decode_tokens_per_s"]
        if row["case"].startswith("vegas_k"):
            other = index.get((row["model"], row["context"], row["case"].replace("vegas", "streaming")))
            if other and "iteration_ms" in other:
                it = row["iteration_ms"]
                row["overhead_vs_streaming"] = (it - other["iteration_ms"]) / it
                row["overhead_timed_steps"] = (row["timed_ms_per_step"] - other["timed_ms_per_step"]) / row[
                    "timed_ms_per_step"
                ]
                for part in ("verify", "draft", "other"):
                    key = f"{part}_ms_per_step"
                    row[f"overhead_{part}"] = (row[key] - other[key]) / it
    return rows


def acceptance_table(records: list[dict]) -> str:
    ks = sorted({r["k"] for r in records})
    k_max = ks[-1]
    lines = [
        f"mean acceptance length (summed over prompts) and acceptance per draft position at K={k_max}; "
        f"ratio {records[0]['ratio']}, min_tokens {records[0]['min_tokens']}",
        f"{'ctx':>5} {'strategy':17} "
        + " ".join(f"{'K=' + str(k):>6}" for k in ks)
        + "  per position (K=max)"
        "  same/plain",
    ]
    table: dict[tuple, dict[int, dict]] = {}
    for r in records:
        table.setdefault((r["prompt_len_class"], r["strategy"]), {})[r["k"]] = r
    for (length, name), by_k in table.items():
        mal = " ".join(f"{by_k[k]['mean_acceptance_length']:6.2f}" if k in by_k else f"{'-':>6}" for k in ks)
        rates = " ".join(f"{x:.2f}" for x in by_k.get(k_max, {}).get("acceptance_per_position", []))
        same = sum(r["identical_to_plain"] for r in by_k.values())
        runs = sum(r["prompts"] for r in by_k.values())
        lines.append(f"{length:>5} {name:17} {mal}  [{rates}]  {same}/{runs}")
    return "\n".join(lines)


def speed_table(rows: list[dict]) -> str:
    lines = [
        f"{'model':32} {'ctx':>6} {'case':16} {'tok/s':>7} {'dec/s':>7} {'x plain':>7} {'MAL':>5} {'draft':>6} "
        f"{'verify':>6} {'other':>6} {'iter':>6}  ms per step; same"
    ]
    for r in rows:
        ms = {
            k: f"{r[f'{k}_ms_per_step']:6.1f}" if f"{k}_ms_per_step" in r else f"{'-':>6}"
            for k in ("draft", "verify", "other")
        }
        mal = f"{r['mean_acceptance_length']:5.2f}" if "mean_acceptance_length" in r else f"{'-':>5}"
        lines.append(
            f"{r['model']:32} {r['context']:>6} {r['case']:16} {r['tokens_per_s']:7.1f} {r['decode_tokens_per_s']:7.1f} "
            f"{r.get('decode_ratio_to_plain', float('nan')):7.2f} {mal} {ms['draft']} "
            f"{ms['verify']} {ms['other']} {r['iteration_ms']:6.1f}  {r['identical_to_plain']}/{r['prompts']}"
        )
    for r in rows:
        if "overhead_vs_streaming" in r:
            lines.append(
                f"{r['model']} {r['context']} {r['case']}: selection + collection overhead vs streaming "
                f"{100 * r['overhead_vs_streaming']:.1f}% of the iteration (verify {100 * r['overhead_verify']:+.1f}%, "
                f"draft {100 * r['overhead_draft']:+.1f}%, untimed/selection {100 * r['overhead_other']:+.1f}%; "
                f"stats-timed steps only: {100 * r['overhead_timed_steps']:.1f}%)"
            )
    lines.append(
        "overhead = (vegas - streaming) / vegas per-step time at the same K and budget; it also includes any "
        "difference in acceptance-driven step mix. 'other' = decode time per step not covered by the stats' "
        "draft/verify timers (selection after verify, readback, bookkeeping)."
    )
    if any(r.get("note") for r in rows):
        lines.append(f"rows of random-weight models: {RANDOM_NOTE}")
    return "\n".join(lines)


def expected_seconds(args, device: str) -> dict[str, float]:
    """A rough runtime estimate: forwards x seconds per forward, with a mean acceptance length of ~2.5."""
    gpu = device.startswith("cuda")
    fwd = (
        0.010 if gpu else 0.10
    )  # fixture forward through our engine: Python-bound on GPU, compute-bound on CPU
    out = {}
    if args.suite in ("acceptance", "all"):
        rows = args.prompts_per_length
        batch = args.acceptance_batch or rows
        calls = -(-rows // batch)
        per_row = 1 if gpu else batch  # a batch costs about one row on the GPU, one row per prompt on the CPU
        run_tokens = args.new_tokens + max(args.ks) + 1
        forwards = sum(run_tokens / 2.5 * (k + 1) for k in args.ks) * len(args.strategies) + args.new_tokens
        out["acceptance"] = len(args.lengths) * calls * forwards * fwd * per_row
    if args.suite in ("speed", "all"):
        per_prompt = args.speed_new_tokens * fwd * (2 + 2 * (args.speed_k + 1) / 2.5)
        fixture = per_prompt * (len(args.speed_lengths) * args.speed_prompts + 0.5)
        if args.quick:
            big = 6 * args.big_new_tokens * (0.004 if gpu else 0.05) * 4 * len(args.big_contexts)
        else:
            big = 30.0  # random init of the 8B model
            for i, context in enumerate(args.big_contexts):
                prefill = 2.5 * (context / 32768) ** 1.5 if gpu else context / 50
                step = (0.022 + 0.16e-6 * context) if gpu else 2.0
                calls = 2 if i == 0 else 1  # warm-ups at the first context
                decode = args.big_new_tokens * step * (2 + 2 * (args.big_k + 2))
                big += calls * (4 * prefill + decode)
        out["speed"] = fixture + big
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=["acceptance", "speed", "all"], default="all")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    _records.add_arguments(parser, "vegas")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run, < 3 min)")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--ratio", type=float, default=0.07)
    parser.add_argument("--min-tokens", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--prompts-per-length", type=int, default=4)
    parser.add_argument(
        "--acceptance-batch",
        type=int,
        default=0,
        help="prompts per generate call in the acceptance suite (0: all of a length at once; counts equal batch 1)",
    )
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--speed-lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--speed-prompts", type=int, default=2)
    parser.add_argument("--speed-k", type=int, default=6)
    parser.add_argument("--speed-new-tokens", type=int, default=128)
    parser.add_argument("--big-contexts", type=int, nargs="+", default=[32768, 65536])
    parser.add_argument("--big-k", type=int, default=4)
    parser.add_argument("--big-new-tokens", type=int, default=32)
    if "--quick" in sys.argv[1:]:  # tiny defaults; explicit flags still win
        parser.set_defaults(**QUICK)
    args = parser.parse_args()
    dtype = (
        getattr(torch, args.dtype)
        if args.dtype
        else (torch.bfloat16 if args.device != "cpu" else torch.float32)
    )
    expected = expected_seconds(args, args.device)
    print(
        "expected runtime: "
        + ", ".join(f"{k} ~{v / 60:.1f} min" for k, v in expected.items())
        + f" (total ~{sum(expected.values()) / 60:.1f} min on {args.device})",
        flush=True,
    )
    started = time.perf_counter()
    result = {
        "machine": machine_info(args.device),
        "args": vars(args),
        "dtype": str(dtype),
        "expected_seconds": expected,
    }
    tables = []
    if args.suite in ("acceptance", "all"):
        result["acceptance"] = suite_acceptance(args, args.device, dtype)
        tables.append(acceptance_table(result["acceptance"]))
    if args.suite in ("speed", "all"):
        result["speed"] = suite_speed(args, args.device, dtype)
        result["speed_summary"] = speed_summary(result["speed"])
        tables.append(speed_table(result["speed_summary"]))
    result["elapsed_s"] = time.perf_counter() - started
    _records.save(args, result, args.device, setting=args.suite + ("_cpu" if args.device == "cpu" else ""))
    print(f"wrote {args.json} in {result['elapsed_s'] / 60:.1f} min")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
