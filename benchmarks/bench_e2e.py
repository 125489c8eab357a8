"""Whole ``generate`` calls on the trained fixtures, every case of a shape side by side in one process.

Target ``code-target``, draft ``code-draft``, held-out prompts of ``prompts_long.jsonl`` cut to the shape's context
(rows cycle through the prompts when the batch is larger than their count), greedy. Each case runs one identical
warm-up call (it also captures the CUDA graphs of a new shape bucket, and gives plain ``generate`` its cuDNN plans),
then ``--repeats`` rounds of one timed call per case, interleaved (each round in another order; default 3 rounds;
per case the call of median decode time is kept). Decode tokens/s = new tokens
after each row's first / (wall - prefill - graph capture), from ``out.speculation``; call tokens/s = all new tokens
/ wall. Plain transformers (``transformers``) has no step timers: its decode tokens/s takes the prefill from a
prefill-only call (``max_new_tokens=1``), an estimate.
``capture_s`` is the timed call's graph capture (0 once the warm-up captured), ``first_capture_s`` the warm-up's.

Cases (``--cases``): ``k0`` (our K = 0 path), ``transformers`` (plain generate), ``STRATEGY:K`` (constant K),
``STRATEGY:utility``, ``auto`` (the planner; its records carry ``chosen``, per member the share of steps and mean
K, where the library reports it); a ``@torch`` suffix on ``prompt_lookup`` runs its device n-gram search on the
PyTorch reference instead of the Triton kernel (an A/B of the search); ``auto@process`` plans in the planner
process (``planner_process=True``), ``auto@share=X`` in the loop with ``X`` (or ``none``: no limit) as its planning
share instead of `PLAN_SHARE` (A/Bs of the planning's host time). A ``+SETTING`` suffix verifies with a LOSSY
sparse-verification setting named in `bench_sparse_quality.TEACHER_FORCED_SETTINGS` (``prompt_lookup:4+default``;
its records carry ``lossy``: the setting's name; `bench_sparse_e2e.py` runs such cases beside their dense twins).

    python benchmarks/bench_e2e.py --shapes 16x16384 --cases k0 transformers prompt_lookup:4 prompt_lookup@torch:4

Mixed workload (``--mixed``; shapes then run only when ``--shapes`` is given): a fixed sequence of calls of
different batch sizes, contexts and contents, built from the prompts and the tokenizer (copy-heavy edits: a chunk
followed by its own beginning again; fresh held-out text; uniform random ids, where no draft is accepted; a batch
mixing copy and fresh rows). Each ``--mixed-cases`` case (plus plain ``transformers``) runs the whole sequence once
as warm-up and once timed; its total is the sum of the timed calls' walls (prefill included, CUDA synchronized
around each call). ``--mixed-scale`` multiplies its contexts and new tokens (0.05 for a CPU smoke run).

    python benchmarks/bench_e2e.py --mixed --mixed-cases k0 prompt_lookup:4 draft_model:4 vegas:6 auto

Writes one record per (device, shape, case) to ``results/e2e.json`` (setting ``<device>:<B>x<L>:<case>``, and
``<device>:mixed:<case>`` for the mixed workload); ``plot_e2e.py`` draws them.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hf_sparse_verify as hsv  # noqa: E402
from benchmarks import _records  # noqa: E402
from benchmarks.bench_sparse_quality import TEACHER_FORCED_SETTINGS  # noqa: E402
from hf_sparse_verify.generation.drafters import prompt_lookup  # noqa: E402
from hf_sparse_verify.generation.profiles import measured_profiles  # noqa: E402

generate_module = importlib.import_module("hf_sparse_verify.generation.generate")

ROOT = Path(__file__).resolve().parents[1]
SHAPES = ["1x4096", "1x16384", "4x16384", "16x16384", "32x8192"]
CASES = [
    "k0", "transformers", "prompt_lookup:4", "prompt_lookup:utility", "draft_model:4", "draft_model:utility",
    "vegas:6", "vegas:utility", "auto",
]  # fmt: skip
MIXED_CASES = [
    "k0", "prompt_lookup:4", "prompt_lookup:utility", "draft_model:4", "draft_model:utility", "vegas:6", "auto"
]  # fmt: skip
#: the mixed workload at scale 1: (content, batch, context, max_new_tokens)
MIXED = [
    ("fresh", 1, 1024, 128),
    ("copy", 1, 2048, 256),
    ("random", 1, 1024, 128),
    ("fresh", 4, 4096, 256),
    ("copy", 4, 8192, 128),
    ("fresh", 1, 16384, 256),
    ("random", 4, 2048, 128),
    ("copy", 16, 4096, 256),
    ("fresh", 16, 8192, 128),
    ("mix", 4, 4096, 256),
    ("copy", 1, 16384, 128),
    ("random", 16, 1024, 128),
    ("fresh", 4, 16384, 128),
    ("copy", 16, 16384, 128),
    ("fresh", 1, 8192, 256),
]
RANDOM_SEED = 1234


@functools.lru_cache(maxsize=4)
def _prompt_ids(path: Path, tokenizer) -> tuple[tuple[int, ...], ...]:
    """Token ids of every held-out prompt of ``path`` (tokenized once per process)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return tuple(tuple(tokenizer(r["text"])["input_ids"]) for r in rows)


def random_ids(tokenizer, length: int, generator: torch.Generator) -> list[int]:
    """``length`` uniform token ids other than EOS (a prompt where drafts have nothing to copy)."""
    row = torch.randint(0, len(tokenizer) - 1, (length,), generator=generator)
    if tokenizer.eos_token_id is not None:
        row = row + (row >= tokenizer.eos_token_id).long()  # uniform over the ids other than EOS
    return row.tolist()


def prompts(
    path: Path, tokenizer, batch: int, context: int, device, content: str = "held_out"
) -> torch.Tensor:
    """``[batch, context]`` ids: held-out prompts of at least ``context`` tokens, cut to ``context``; with
    ``content="random"``, `random_ids` rows (seeded)."""
    if content == "random":
        gen = torch.Generator().manual_seed(RANDOM_SEED)
        return torch.tensor([random_ids(tokenizer, context, gen) for _ in range(batch)], device=device)
    ids = [list(x[:context]) for x in _prompt_ids(path, tokenizer) if len(x) >= context]
    if not ids:
        raise SystemExit(f"no prompt of {context} tokens in {path}")
    return torch.tensor([ids[i % len(ids)] for i in range(batch)], device=device)


def mixed_sequence(path: Path, tokenizer, scale: float = 1.0, device="cpu") -> list[dict]:
    """The mixed workload's calls (``MIXED`` with contexts and new tokens times ``scale``), each a dict of ``name``,
    ``content``, ``batch``, ``context``, ``new_tokens`` and ``ids`` (``[batch, context]``). Deterministic: the same
    prompts file, tokenizer and scale give the same ids. Row r of call i takes prompt ``(3 i + r) mod n``; a copy
    row is the last ``context - m`` tokens of its prompt followed by their first ``m`` again (``m`` = context / 8),
    so the continuation repeats text of the prompt; a fresh row is the prompt's first ``context`` tokens; a random
    row is uniform ids (EOS excluded) from a generator seeded per call; a ``mix`` call alternates copy and fresh
    rows."""
    texts = _prompt_ids(path, tokenizer)
    calls = []
    for i, (content, batch, context, new_tokens) in enumerate(MIXED):
        context = max(16, round(context * scale))
        new_tokens = max(4, round(new_tokens * scale))
        usable = [x for x in texts if len(x) >= context]
        if not usable:
            raise SystemExit(f"no prompt of {context} tokens in {path}")
        rows = []
        gen = torch.Generator().manual_seed(RANDOM_SEED + i)
        for r in range(batch):
            text = usable[(3 * i + r) % len(usable)]
            kind = content if content != "mix" else ("copy", "fresh")[r % 2]
            if kind == "copy":
                m = max(4, context // 8)
                chunk = list(text[-(context - m) :])
                rows.append(chunk + chunk[:m])
            elif kind == "fresh":
                rows.append(list(text[:context]))
            else:
                rows.append(random_ids(tokenizer, context, gen))
        calls.append(
            dict(
                name=f"{i:02d}:{content}:{batch}x{context}",
                content=content,
                batch=batch,
                context=context,
                new_tokens=new_tokens,
                ids=torch.tensor(rows, device=device),
            )
        )
    return calls


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _generated(new: torch.Tensor, eos) -> int:
    """New tokens of plain ``generate``'s ``[B, T]`` output: each row up to and including its first EOS (a model
    with no EOS token, such as a random one built from a config, runs every row to the end)."""
    eos = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    if not eos:
        return new.numel()
    eos = torch.tensor(eos, device=new.device)
    stop = torch.isin(new, eos)
    first = torch.where(stop.any(dim=1), stop.int().argmax(dim=1) + 1, new.shape[1])
    return int(first.sum())


def parse_case(case: str) -> dict:
    """A case's label fields and ``generate`` arguments: ``strategy`` (``k0``, ``transformers``, the strategy name,
    with ``@torch`` kept), ``k_policy`` (``plain``, ``constant``, ``utility``, ``heuristic``, ``auto``, None for
    plain generate), ``num_draft_tokens``, ``search``, ``lossy`` (the lossy setting's name, else None) and
    ``speculation`` (None for plain generate)."""
    case, _, lossy = case.partition("+")
    if lossy:
        parsed = parse_case(case)
        if parsed["speculation"] is None or parsed["strategy"] in ("k0", "transformers"):
            raise SystemExit(f"case {case}+{lossy}: a lossy setting needs a drafting strategy (STRATEGY:K, ...)")
        parsed["speculation"]["lossy_sparse_verify"] = lossy_setting(lossy).to_dict()
        return dict(parsed, lossy=lossy)
    name, _, k = case.partition(":")
    strategy, _, search = name.partition("@")
    if strategy == "transformers":
        return dict(
            strategy="transformers", k_policy=None, num_draft_tokens=None, search="", lossy=None, speculation=None
        )
    if strategy == "k0":
        spec, label, k_policy = dict(strategy="prompt_lookup", k_policy="plain"), "k0", "plain"
    elif k in ("utility", "heuristic"):
        spec, label, k_policy = dict(strategy=strategy, k_policy=k), name, k
    elif strategy == "auto":
        if search.startswith("share="):
            _share(search)  # checked now, not at the first call
        elif search not in ("", "process"):
            raise SystemExit(f"case {case!r}: auto takes only @process, @share=FRACTION or @share=none")
        spec, label, k_policy = dict(strategy="auto"), name, "auto"
        if search == "process":
            spec["planner_process"] = True
    elif k.isdigit():
        spec, label, k_policy = (
            dict(strategy=strategy, num_draft_tokens=int(k), max_draft_tokens=max(16, int(k))),
            name,
            "constant",
        )
    else:
        raise SystemExit(f"case {case!r}: expected k0, transformers, auto, STRATEGY:K or STRATEGY:utility")
    return dict(
        strategy=label,
        k_policy=k_policy,
        num_draft_tokens=int(k) if k.isdigit() else None,
        search=search,
        lossy=None,
        speculation=spec,
    )


def lossy_setting(name: str):
    """The LOSSY sparse-verification setting of that name (`bench_sparse_quality.TEACHER_FORCED_SETTINGS`, where
    its quality is measured)."""
    if name not in TEACHER_FORCED_SETTINGS:
        raise SystemExit(f"unknown lossy setting {name!r}: use one of {sorted(TEACHER_FORCED_SETTINGS)}")
    return TEACHER_FORCED_SETTINGS[name]


def _share(search: str) -> float | None:
    """The planning share of an ``auto@share=X`` case (None for ``none``: no limit)."""
    value = search.partition("=")[2]
    if value == "none":
        return None
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"auto@{search}: expected share=FRACTION or share=none") from None


def _call(parsed: dict, target, draft, ids: torch.Tensor, new_tokens: int, device):
    """One ``generate`` call of a parsed case, CUDA synchronized around it: (output, wall seconds)."""
    common = dict(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
    )
    kwargs = {}
    if parsed["speculation"] is not None:
        spec = parsed["speculation"]
        kwargs = dict(custom_generate=hsv.generate, speculation=spec, return_dict_in_generate=True)
        if spec["strategy"] in ("draft_model", "auto"):
            kwargs["draft_model"] = draft
    prompt_lookup.DEVICE_SEARCH_KERNEL = False if parsed["search"] == "torch" else None
    share = generate_module.PLAN_SHARE
    if parsed["search"].startswith("share="):  # an A/B of the planner's planning share
        generate_module.PLAN_SHARE = _share(parsed["search"])
    try:
        _sync(device)
        start = time.perf_counter()
        out = target.generate(**common, **kwargs)
        _sync(device)
        return out, time.perf_counter() - start
    finally:
        prompt_lookup.DEVICE_SEARCH_KERNEL = None
        generate_module.PLAN_SHARE = share


def _chosen(stats):
    """The planner's choice per member (``{name: {"share", "mean_k"}}``), where the library reports it."""
    chosen = getattr(stats, "chosen", None)
    return json.loads(json.dumps(chosen, default=float)) if chosen is not None else None


def run_case(case: str, target, draft, ids, new_tokens: int, device, repeats: int = 1) -> dict:
    """One warm-up call and ``repeats`` timed calls of ``case`` alone (`run_cases` interleaves several cases)."""
    return run_cases([case], target, draft, ids, new_tokens, device, repeats)[case]


def run_cases(cases, target, draft, ids, new_tokens: int, device, repeats: int = 1) -> dict:
    """Every case's warm-up call, then ``repeats`` rounds of one timed call per case, each round in another order
    (rotated by one case), so that a drift of the machine over the minutes a shape takes (clocks, the host's load:
    one H200 saw our K = 0 at 1 x 4K go 1120 -> 1428 -> 2061 tokens/s over three back-to-back calls) lands on every
    case alike instead of on whichever ran last. Per case its record: the measured fields come from the timed call
    of median decode time (``decode_tokens_per_s_all`` lists every timed call's, in order)."""
    parsed = {case: parse_case(case) for case in cases}
    first = {case: _call(parsed[case], target, draft, ids, new_tokens, device) for case in cases}  # warm-ups
    timed: dict = {case: [] for case in cases}
    for round_ in range(repeats):
        shift = round_ % len(cases)
        for case in [*cases[shift:], *cases[:shift]]:
            timed[case].append(_call(parsed[case], target, draft, ids, new_tokens, device))
    return {
        case: _record(parsed[case], first[case], timed[case], target, draft, ids, device) for case in cases
    }


def _record(parsed: dict, first, timed: list, target, draft, ids, device) -> dict:
    """A case's record from its warm-up call and timed calls (each ``(output, wall seconds)`` of `_call`)."""
    fields = {k: parsed[k] for k in ("strategy", "k_policy", "num_draft_tokens")}
    if parsed["lossy"]:
        fields["lossy"] = parsed["lossy"]
    repeats = len(timed)
    # plain generate: the calls, then a prefill-only call for the decode figure
    if parsed["speculation"] is None:
        out = first[0]
        walls = sorted(wall for _, wall in timed)
        wall = walls[len(walls) // 2]
        _, prefill = _call(parsed, target, draft, ids, 1, device)
        new = out[:, ids.shape[1] :]
        generated = _generated(new, target.generation_config.eos_token_id)
        decode_s = wall - prefill
        return dict(
            fields,
            decode_tokens_per_s=(generated - ids.shape[0]) / decode_s if decode_s > 0 else None,
            call_tokens_per_s=generated / wall,
            mean_acceptance_length=1.0,
            steps=max(new.shape[1] - 1, 0),
            draft_ms=None,
            verify_ms=None,
            update_ms=None,
            capture_s=0.0,
            first_capture_s=0.0,
            prefill_s=prefill,
            wall_s=wall,
            repeats=repeats,
        )

    def decode_time(s) -> float:
        return s.wall_time_s - s.prefill_time_s - s.graph_capture_s

    timed = [out.speculation for out, _ in timed]
    rates = [(sum(t.new_tokens) - len(t.new_tokens)) / decode_time(t) for t in timed]
    s = sorted(timed, key=decode_time)[len(timed) // 2]
    decode_s = decode_time(s)
    generated = sum(s.new_tokens)
    steps = max(s.steps, 1)
    record = dict(
        fields,
        decode_tokens_per_s=(generated - len(s.new_tokens)) / decode_s,
        call_tokens_per_s=generated / s.wall_time_s,
        mean_acceptance_length=s.mean_acceptance_length,
        steps=s.steps,
        draft_ms=1000 * s.draft_time_s / steps,
        verify_ms=1000 * s.verify_time_s / steps,
        update_ms=1000 * s.update_time_s / steps,
        capture_s=s.graph_capture_s,
        first_capture_s=first[0].speculation.graph_capture_s,
        prefill_s=s.prefill_time_s,
        wall_s=s.wall_time_s,
        loop_s=s.loop_time_s,
        between_steps_ms=1000 * s.between_steps_s / steps,
        policy_ms=1000 * s.policy_time_s / steps,
        repeats=repeats,
        decode_tokens_per_s_all=rates,
        capture_s_all=[t.graph_capture_s for t in timed],
        interleaved=True,
    )
    chosen = _chosen(s)
    if chosen is not None or parsed["strategy"].startswith("auto"):
        record["chosen"] = chosen
    record["trace"] = step_trace(s)
    return record


def step_trace(s) -> dict:
    """The kept call's steps, for ``--trace``: per step the drafter, K, accepted and proposed drafts per row (None
    for finished rows), the (draft, verify, update) seconds and what the K policy reported."""
    fields = (
        "members",
        "draft_tokens",
        "accepted_tokens",
        "proposed_tokens",
        "step_parts_s",
        "policy_states",
    )
    return {name: getattr(s, name) for name in fields}


def _add_trace(path: str, key: str, value) -> None:
    """``value`` under ``key`` in the ``--trace`` file (kept across shapes and runs)."""
    path = Path(path)
    traces = json.loads(path.read_text()) if path.exists() else {}
    traces[key] = value
    path.write_text(json.dumps(traces))


def device_name(device) -> str:
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_shape(
    target,
    draft,
    tokenizer,
    prompts_path,
    shape: str,
    cases,
    new_tokens: int,
    device,
    content: str = "held_out",
    repeats: int = 1,
):
    """Every case at one ``BxL`` shape: ``[(setting, record), ...]``, with ``vs_k0`` (decode tokens/s over the
    ``k0`` case's) and ``vs_plain`` (call tokens/s over plain generate's), None where that case did not run.
    ``content="random"`` runs random-token prompts (records ``prompt: "random"``, settings ``...:random:<case>``)."""
    batch, context = (int(x) for x in shape.split("x"))
    ids = prompts(Path(prompts_path), tokenizer, batch, context, device, content)
    results = run_cases(list(cases), target, draft, ids, new_tokens, device, repeats)
    gpus = len({p.device for p in target.parameters() if p.device.type == "cuda"})
    k0 = results.get("k0", {}).get("decode_tokens_per_s")
    plain = results.get("transformers", {}).get("call_tokens_per_s")
    out = []
    for case, result in results.items():
        record = dict(
            device=device_name(device), shape=shape, batch=batch, context=context, new_tokens=new_tokens, gpus=gpus
        )
        record.update(result)
        decode = result.get("decode_tokens_per_s")
        record["vs_k0"] = decode / k0 if k0 and decode else None
        record["vs_plain"] = result["call_tokens_per_s"] / plain if plain else None
        where = shape
        if content != "held_out":
            record["prompt"] = content
            where = f"{shape}:{content}"
        out.append((f"{torch.device(device).type}{f'x{gpus}' if gpus > 1 else ''}:{where}:{case}", record))
    return out


def per_call_oracle(records: list[dict]) -> float:
    """What choosing a strategy per call could reach at best on the mixed workload: the sum over calls of the
    fastest of ``records``' walls on each (below the truth: each call is timed once, and the least of several noisy
    walls is the luckiest).

    Example:
        >>> a = {"per_call": [{"wall_s": 1.0}, {"wall_s": 4.0}]}
        >>> b = {"per_call": [{"wall_s": 2.0}, {"wall_s": 3.0}]}
        >>> per_call_oracle([a, b])
        4.0
    """
    calls = {len(r["per_call"]) for r in records}
    if len(calls) != 1:
        raise ValueError(f"the records ran different numbers of calls: {sorted(calls)}")
    return sum(min(r["per_call"][i]["wall_s"] for r in records) for i in range(calls.pop()))


def run_mixed(target, draft, calls: list[dict], cases, device, scale: float = 1.0, save=None):
    """The mixed workload (``mixed_sequence``) for every case and plain generate (last: the slowest):
    ``[(setting, record), ...]``. Each case runs the whole sequence as warm-up, then timed; ``total_s`` sums the
    timed calls' walls. ``vs_k0`` = k0 total / this total, ``vs_plain`` = plain generate's total / this total;
    ``auto`` also gets ``vs_best_fixed`` (the fastest other case of ours, k0 included, over auto), per call
    ``chosen``, and ``best_fixed_per_call_s``: the sum over calls of the fastest fixed case's wall on each (what a
    perfect per-call choice would take), with ``per_call_oracle_vs_best_fixed`` its ratio to the best fixed total.
    ``save(setting, record)``, when given, gets each case's record as soon as it is measured (before the ratios),
    so a run cut short keeps what it measured."""
    cases = list(dict.fromkeys([*(c for c in cases if c != "transformers"), "transformers"]))
    setting_of = {case: f"{torch.device(device).type}:mixed:{case}" for case in cases}
    results = {}
    for case in tqdm(cases, desc="mixed"):
        parsed = parse_case(case)
        eos = target.generation_config.eos_token_id
        for timed in (False, True):
            per_call, capture = [], 0.0
            for call in calls:
                out, wall = _call(parsed, target, draft, call["ids"], call["new_tokens"], device)
                entry = dict(name=call["name"], batch=call["batch"], context=call["context"],
                             new_tokens=call["new_tokens"], wall_s=wall)  # fmt: skip
                s = getattr(out, "speculation", None)
                if s is None:
                    entry["generated"] = _generated(out[:, call["ids"].shape[1] :], eos)
                else:
                    capture += s.graph_capture_s
                    entry.update(
                        generated=sum(s.new_tokens),
                        steps=s.steps,
                        mean_acceptance_length=s.mean_acceptance_length,
                        capture_s=s.graph_capture_s,
                    )
                    chosen = _chosen(s)
                    if chosen is not None or parsed["strategy"].startswith("auto"):
                        entry["chosen"] = chosen
                per_call.append(entry)
            if not timed:
                first_capture = capture
        total = sum(c["wall_s"] for c in per_call)
        tokens = sum(c["generated"] for c in per_call)
        results[case] = dict(
            device=device_name(device),
            shape="mixed",
            mixed_scale=scale,
            strategy=parsed["strategy"],
            k_policy=parsed["k_policy"],
            num_draft_tokens=parsed["num_draft_tokens"],
            calls=len(per_call),
            total_s=total,
            tokens=tokens,
            call_tokens_per_s=tokens / total,
            capture_s=capture,
            first_capture_s=first_capture,
            per_call=per_call,
        )
        if save is not None:
            save(setting_of[case], results[case])
    k0 = results.get("k0", {}).get("total_s")
    plain = results["transformers"]["total_s"]
    fixed = {c: r["total_s"] for c, r in results.items() if not c.startswith("auto") and c != "transformers"}
    out = []
    for case, record in results.items():
        record["vs_k0"] = k0 / record["total_s"] if k0 else None
        record["vs_plain"] = plain / record["total_s"]
        if record["strategy"].startswith("auto"):
            best = min(fixed, key=fixed.get) if fixed else None
            record["best_fixed"] = best
            record["vs_best_fixed"] = fixed[best] / record["total_s"] if best else None
            oracle = per_call_oracle([results[c] for c in fixed]) if fixed else None
            record["best_fixed_per_call_s"] = oracle
            record["per_call_oracle_vs_best_fixed"] = oracle / fixed[best] if best else None
        out.append((setting_of[case], record))
    return out


def load_models(shared, device, dtype=None, gpus: int = 1):
    """(tokenizer, target, draft) of ``<shared>/models``; dtype bfloat16 on GPU, float32 on CPU by default.
    ``gpus`` > 1: the target's decoder layers split evenly over the first ``gpus`` GPUs by an accelerate device map
    (embedding with the first layers, final norm and head with the last, or with the embedding where they are
    tied), the draft on the first."""
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    models = Path(shared) / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "code-target")
    if gpus > 1:
        from accelerate import dispatch_model

        if torch.cuda.device_count() < gpus:
            raise SystemExit(f"--gpus {gpus}: this machine has {torch.cuda.device_count()} CUDA GPUs")
        target = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=dtype).eval()
        layers = target.config.num_hidden_layers
        last = 0 if target.config.tie_word_embeddings else gpus - 1  # a tied head stays with its embedding
        device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": last, "lm_head": last}
        device_map.update({f"model.layers.{i}": i * gpus // layers for i in range(layers)})
        target = dispatch_model(target, device_map=device_map)
        draft = AutoModelForCausalLM.from_pretrained(models / "code-draft", dtype=dtype).to("cuda:0").eval()
        return tokenizer, target, draft
    target = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=dtype).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "code-draft", dtype=dtype).to(device).eval()
    return tokenizer, target, draft


def _print(record: dict) -> None:
    shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items() if k != "per_call"}
    print(json.dumps(shown))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", nargs="*", default=None, help=f"BxL, e.g. 16x16384 (default {' '.join(SHAPES)}; none "
        "with --mixed unless given)",
    )  # fmt: skip
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed calls per case after the warm-up; the median one is kept",
    )
    parser.add_argument(
        "--prompt", choices=["held_out", "random"], default="held_out",
        help="the shapes' prompts: held-out code (default) or random tokens",
    )  # fmt: skip
    parser.add_argument("--mixed", action="store_true", help="run the mixed workload")
    parser.add_argument(
        "--mixed-cases", nargs="+", default=MIXED_CASES, help="plain generate always runs too"
    )
    parser.add_argument(
        "--mixed-scale", type=float, default=1.0, help="times the mixed contexts and new tokens"
    )
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument(
        "--gpus", type=int, default=1, help="split the target's layers over this many GPUs (a device map); "
        "records are named <device>x<gpus>:...",
    )  # fmt: skip
    parser.add_argument(
        "--trace", default=None, help="also write each case's per-step trace (drafter, K, accepted per row, step "
        "parts, policy reports) to this JSON file, keyed by setting",
    )  # fmt: skip
    _records.add_arguments(parser, "e2e")
    args = parser.parse_args(argv)
    if args.setting:
        raise SystemExit("bench_e2e names each record itself (<device>:<shape>:<case>); drop --setting")
    shapes = args.shapes if args.shapes is not None else ([] if args.mixed else SHAPES)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    tokenizer, target, draft = load_models(args.shared, args.device, dtype, args.gpus)
    prompts_path = Path(args.shared) / "models" / "prompts_long.jsonl"
    for shape in shapes:
        for setting, record in run_shape(
            target,
            draft,
            tokenizer,
            prompts_path,
            shape,
            args.cases,
            args.new_tokens,
            args.device,
            args.prompt,
            args.repeats,
        ):
            trace = record.pop("trace", None)
            if args.trace and trace is not None:
                _add_trace(args.trace, setting, trace)
            _print(record)
            _records.save(args, record, args.device, setting=setting)
        if args.trace:  # the auto planner's cost profiles as measured so far (what its estimates were priced by)
            _add_trace(args.trace, f"profiles after {shape}", measured_profiles())
    if args.mixed:
        calls = mixed_sequence(prompts_path, tokenizer, args.mixed_scale, args.device)

        def save(setting: str, record: dict) -> None:  # each case as measured (a cut run keeps it)
            _records.save(args, record, args.device, setting=setting)

        for setting, record in run_mixed(
            target, draft, calls, args.mixed_cases, args.device, args.mixed_scale, save=save
        ):
            _print(record)
            _records.save(args, record, args.device, setting=setting)


if __name__ == "__main__":
    main()
