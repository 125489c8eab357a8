"""Quality of LOSSY sparse verification on the trained fixtures, against dense (lossless) verification.

For every model, context and setting, each held-out prompt is generated twice with the same drafter and K:
dense verification and the setting, greedy, ``--new-tokens`` tokens. Per setting:

- ``token_agreement``: share of the new-token positions where the two outputs hold the same token (all prompts);
- ``first_divergence``: mean index of the first differing token (``new_tokens`` when identical);
- ``acceptance_ratio``: mean acceptance length with the setting / with dense verification;
- ``nll_dense_model``: the dense model's mean NLL of the setting's continuation (teacher-forced plain forward), next
  to that of the dense continuation (``nll_dense_output``);
- ``verify_ms``: mean verify time per step as the loop measured it (``out.speculation``), dense and sparse;
- ``verify_flops`` / ``verify_bytes``: the verify pass's FLOPs and bytes per step (the sparse-verification paper Table 1), computed from
  the shapes and the setting's NOMINAL budgets (attention: the budget rule at this context; FFN: the calibrated
  channel sparsity; MoE: per-token rules skip half their ``max_skip`` on average, ``row_union`` reads at most
  ``row_experts`` experts per layer, expert bytes counted per distinct expert a step reads under uniform routing),
  each with the dense figure.

Writes the ``fixtures`` record of ``--json`` (default benchmarks/results/sparse_quality.json: records with model, context, setting,
token_agreement, acceptance_ratio, ...) and a PNG of quality against verify time next to it.

    python benchmarks/bench_sparse_quality.py --models ../shared/models
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.calibrate import calibrate
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE
from hf_sparse_verify.sparse.calibration import FILE_NAME

DEFAULT = LossySparseVerify()  # attention only: block 64, rho 0.1, L0 4096, window-scored (shared_window) schedule

DENSE_SETTINGS = {
    "default": DEFAULT,
    "attn_rho0.05": LossySparseVerify(attention=SparseAttention(rho=0.05)),
    "attn_rho0.3": LossySparseVerify(attention=SparseAttention(rho=0.3)),
    "attn_L2K": LossySparseVerify(attention=SparseAttention(dense_below=2048)),
    "attn_exact": LossySparseVerify(attention=SparseAttention(schedule="exact_merged")),
    "attn_approx4": LossySparseVerify(attention=SparseAttention(schedule="approx_shared", group_size=4)),
    "attn_reuse": LossySparseVerify(attention=SparseAttention(reuse=True)),  # a quarter of the layers select
    "ffn0.3": LossySparseVerify(attention=None, ffn=SparseFFN(sparsity=0.3)),
    "ffn0.5": LossySparseVerify(attention=None, ffn=SparseFFN(sparsity=0.5)),
    "attn+ffn0.5": LossySparseVerify(attention=SparseAttention(), ffn=SparseFFN(sparsity=0.5)),
    # what reaches 1.5x on the 1 x 64K verify step (bench_sparse_verify.py attn_reuse_ffn75)
    "attn_reuse+ffn0.75": LossySparseVerify(
        attention=SparseAttention(reuse=True), ffn=SparseFFN(sparsity=0.75)
    ),
}
MOE_SETTINGS = {
    "default": DEFAULT,
    "moe_skip1": LossySparseVerify(attention=None, moe=SparseMoE(max_skip=1, max_damage=1.0)),
    "moe_skip2": LossySparseVerify(attention=None, moe=SparseMoE(max_skip=2, max_damage=1.0)),
    "moe_budget2": LossySparseVerify(
        attention=None, moe=SparseMoE(rule="budget", max_skip=2, max_damage=1.0)
    ),
    "attn+moe_skip1": LossySparseVerify(moe=SparseMoE(max_skip=1, max_damage=1.0)),
    # a quarter of the routed experts kept (1 of code-moe's 4), as `moe_skip6` keeps 2 of 8 on the 30B-A3B shape in
    # bench_sparse_verify.py
    "moe_keep1": LossySparseVerify(
        attention=None, moe=SparseMoE(rule="budget", max_skip=3, budget=0.1, max_damage=1.0)
    ),
    # row_union (ours): a verify row's tokens share its `row_experts` heaviest of code-moe's 16 experts
    "moe_row4": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=4)),
    "moe_row8": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=8)),
    "moe_row8_keep2": LossySparseVerify(
        attention=None, moe=SparseMoE(rule="row_union", max_skip=2, row_experts=8)
    ),
}


def _load(path: str, device, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _prompts(file: str, length: int, count: int, tokenizer) -> list[torch.Tensor]:
    rows = [json.loads(line) for line in open(file)]
    texts = [r["text"] for r in rows if r["len"] == length][:count]
    return [tokenizer(t, return_tensors="pt")["input_ids"][0] for t in texts]


def _generate(model, ids, new_tokens: int, speculation: dict, draft=None):
    out = model.generate(
        input_ids=ids[None].to(model.device), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, custom_generate=hsv.generate, speculation=speculation, draft_model=draft,
        return_dict_in_generate=True,
    )  # fmt: skip
    stats = out.speculation
    steps = max(stats.steps, 1)
    return (
        out.sequences[0, ids.numel() :].cpu(),
        stats.mean_acceptance_length,
        1000 * stats.verify_time_s / steps,
    )


@torch.no_grad()
def _nll(model, ids: torch.Tensor, continuation: torch.Tensor) -> float:
    """Mean NLL of ``continuation`` after ``ids`` under the plain (dense) model."""
    full = torch.cat([ids, continuation])[None].to(model.device)
    logits = model(full, logits_to_keep=continuation.numel() + 1).logits[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, continuation.to(model.device)))


def verify_cost(model, setting: LossySparseVerify, calibration, context: int, q: int) -> dict:
    """FLOPs and bytes of one verify step of ``q`` tokens over ``context`` cached tokens, dense and with the
    setting's nominal budgets (bf16 weights and cache)."""
    c = model.config.get_text_config()
    layers, hidden, heads = c.num_hidden_layers, c.hidden_size, c.num_attention_heads
    kv_heads = c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    attn_proj = hidden * head_dim * (2 * heads + 2 * kv_heads)
    experts_k = getattr(c, "num_experts_per_tok", None)
    experts = getattr(c, "num_experts", None) or getattr(c, "num_local_experts", None)
    inter = getattr(c, "moe_intermediate_size", None) if experts_k else c.intermediate_size
    ffn_params = 3 * hidden * inter  # one MLP or one expert
    kept_ctx = (
        setting.attention.budget_blocks(context) * setting.attention.block_size
        if setting.attention
        else context
    )
    kept_ctx = min(kept_ctx, context)
    ffn_keep = 1.0 - setting.ffn.sparsity if setting.ffn is not None else 1.0

    def distinct(per_token: float) -> float:  # experts a step reads when q tokens route uniformly at random
        return experts * (1.0 - (1.0 - per_token / experts) ** q)

    # (experts computed per token, experts read per step); a dense model: (1, 1) MLP
    moe_dense = (experts_k, distinct(experts_k)) if experts_k else (1.0, 1.0)
    moe_kept = moe_dense
    if setting.moe is not None and experts_k:
        m = min(setting.moe.max_skip, experts_k - 1)
        if setting.moe.rule == "row_union":  # the row's set bounds what is read; each token keeps >= k - m
            read = min(float(setting.moe.row_experts), moe_dense[1])
            moe_kept = (max(experts_k * read / moe_dense[1], experts_k - m), read)
        else:  # per-token rules: about half the tokens skip the most they may (the median rule)
            per_token = experts_k - 0.5 * m
            moe_kept = (per_token, distinct(per_token))

    def cost(ctx, fkeep, moe):
        per_token, read = moe
        attn_flops = 4 * q * ctx * heads * head_dim
        flops = layers * (2 * q * attn_proj + attn_flops + 2 * q * ffn_params * fkeep * per_token)
        weights = layers * (attn_proj + ffn_params * fkeep * read) * 2
        kv = layers * 2 * ctx * kv_heads * head_dim * 2
        return flops, weights + kv

    dense_flops, dense_bytes = cost(context, 1.0, moe_dense)
    flops, nbytes = cost(kept_ctx, ffn_keep, moe_kept)
    return dict(
        verify_flops=flops,
        verify_bytes=nbytes,
        dense_verify_flops=dense_flops,
        dense_verify_bytes=dense_bytes,
    )


def run_model(name, path, prompt_file, contexts, settings, args, device, dtype, draft=None) -> list[dict]:
    model, tokenizer = _load(path, device, dtype)
    calibration = None
    if any(s.needs_calibration() for s in settings.values()):
        # calibration windows (2K) are other held-out windows than the evaluated ones (4K, 8K, 16K)
        cal_prompts = _prompts(
            os.path.join(args.models, "prompts.jsonl"), 2048, args.calibration_prompts, tokenizer
        )
        needs_moe = next((s.moe for s in settings.values() if s.moe is not None), None)
        needs_ffn = any(s.ffn is not None for s in settings.values())
        cfg = LossySparseVerify(ffn=SparseFFN() if needs_ffn else None, moe=needs_moe)
        begin = time.perf_counter()
        calibration = calibrate(model, cal_prompts, cfg, verify_tokens=args.k + 1, progress=True)
        folder = os.path.join(args.calibration_dir, name)
        calibration.save(folder)
        print(
            f"{name}: calibrated in {time.perf_counter() - begin:.1f} s -> {folder}/{FILE_NAME}",
            file=sys.stderr,
        )
    records = []
    strategy = "draft_model" if draft is not None else "prompt_lookup"
    base = dict(strategy=strategy, num_draft_tokens=args.k)
    for context in contexts:
        # the fixtures are trained on windows of at most 16K positions: keep prompt + new tokens + drafts inside
        # the window (the last tokens of each prompt), or both verifications run past what the model knows
        keep = context - args.new_tokens - args.k - 1
        prompts = [ids[-keep:] for ids in _prompts(prompt_file, context, args.prompts, tokenizer)]
        dense_runs = []
        for ids in tqdm(prompts, desc=f"{name} {context} dense", file=sys.stderr):
            dense_runs.append(_generate(model, ids, args.new_tokens, base, draft))
        dense_nll = [_nll(model, ids, run[0]) for ids, run in zip(prompts, dense_runs)]
        for setting_name, setting in settings.items():
            if setting.needs_calibration():
                setting = LossySparseVerify(
                    attention=setting.attention, ffn=setting.ffn, moe=setting.moe,
                    calibration=os.path.join(args.calibration_dir, name),
                )  # fmt: skip
            spec = dict(base, lossy_sparse_verify=setting.to_dict())
            try:
                record = _evaluate(model, name, context, setting_name, setting, spec, prompts, dense_runs, dense_nll,
                                   calibration, strategy, draft, args)  # fmt: skip
            except Exception as err:  # noqa: BLE001 - one failing setting is reported, the others still run
                record = dict(
                    model=name, context=context, setting=setting_name, error=f"{type(err).__name__}: {err}"
                )
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "setting_detail"}), flush=True)
    return records


def _evaluate(model, name, context, setting_name, setting, spec, prompts, dense_runs, dense_nll, calibration,
              strategy, draft, args) -> dict:  # fmt: skip
    same = total = 0
    first, accept, accept_dense, nll, vms, vms_dense = [], [], [], [], [], []
    for ids, (dense_out, dense_acc, dense_ms) in tqdm(
        list(zip(prompts, dense_runs)), desc=f"{name} {context} {setting_name}", file=sys.stderr
    ):
        out, acc, ms = _generate(model, ids, args.new_tokens, spec, draft)
        n = min(out.numel(), dense_out.numel())
        match = out[:n] == dense_out[:n]
        same += int(match.sum())
        total += n
        first.append(int((~match).nonzero()[0]) if not bool(match.all()) else n)
        accept.append(acc)
        accept_dense.append(dense_acc)
        nll.append(_nll(model, ids, out))
        vms.append(ms)
        vms_dense.append(dense_ms)
    record = dict(
        model=name, context=context, setting=setting_name, setting_detail=setting.to_dict(),
        strategy=strategy, k=args.k, prompts=len(prompts), new_tokens=args.new_tokens,
        token_agreement=round(same / max(total, 1), 4), first_divergence=round(sum(first) / len(first), 1),
        acceptance_length=round(sum(accept) / len(accept), 3),
        dense_acceptance_length=round(sum(accept_dense) / len(accept_dense), 3),
        acceptance_ratio=round(sum(accept) / max(sum(accept_dense), 1e-9), 4),
        nll_dense_model=round(sum(nll) / len(nll), 4), nll_dense_output=round(sum(dense_nll) / len(dense_nll), 4),
        verify_ms=round(sum(vms) / len(vms), 3), dense_verify_ms=round(sum(vms_dense) / len(vms_dense), 3),
        **verify_cost(model, setting, calibration, context, args.k + 1),
    )  # fmt: skip
    return record


def plot_teacher_forced(records: list[dict], path: str) -> str:
    """The teacher-forced records drawn: per context, each setting's delta NLL against dense with its bootstrap 95%
    interval, the noise floor's beside them, and each bar labelled with top-1, KL and the class granted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("suite") == "teacher_forced" and "delta_nll_pct" in r]
    panel = lambda r: (r.get("model", "code-target"), r["context"], r.get("window", 7))  # noqa: E731
    panels = sorted({panel(r) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (model, context, window) in zip(axes[0], panels):
        here = sorted(
            (r for r in rows if panel(r) == (model, context, window)), key=lambda r: r["delta_nll_pct"]
        )
        floor = next((r["noise_floor"] for r in here if r.get("noise_floor")), None)
        bars = [("noise floor (bf16 vs fp32)", floor, "")] if floor else []
        bars += [(r["setting"], r, r.get("class", "")) for r in here]
        for i, (_, r, grade) in enumerate(bars):
            low, high = r["delta_nll_ci"]
            colour = {"near_exact": "tab:green", "balanced": "tab:blue", "fast": "tab:orange"}.get(grade, "grey")
            ax.errorbar(r["delta_nll_pct"], i, xerr=[[r["delta_nll_pct"] - low], [high - r["delta_nll_pct"]]],
                        fmt="o", color=colour, capsize=3)  # fmt: skip
            ax.annotate(f"top-1 {r['top1']:.3f}, KL {r['kl']:.4f} {grade}", (high, i), xytext=(4, -3),
                        textcoords="offset points", fontsize=6)  # fmt: skip
        ax.set_yticks(range(len(bars)), [name for name, _, _ in bars], fontsize=7)
        ax.axvline(0.0, color="grey", lw=0.5)
        ax.axvline(1.0, color="tab:blue", lw=0.5, ls="--")
        ax.set_xlabel("delta NLL against dense verification, % [bootstrap 95% CI]")
        ax.set_title(f"{model}, {context // 1024}K context, verify rows of {window} tokens", fontsize=9)
    fig.suptitle("LOSSY sparse verification, teacher-forced on held-out code (float32); "
                 "dashed: balanced's +1% gate", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["context"]) for r in records if "error" not in r})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for model, context in groups:
        rows = [r for r in records if r["model"] == model and r["context"] == context and "error" not in r]
        x = [r["verify_ms"] / r["dense_verify_ms"] for r in rows]
        for ax, key in zip(axes, ("token_agreement", "acceptance_ratio")):
            ax.scatter(x, [r[key] for r in rows], label=f"{model} {context // 1024}K")
            for xi, r in zip(x, rows):
                ax.annotate(r["setting"], (xi, r[key]), fontsize=6)
    for ax, key in zip(axes, ("token agreement with dense verify", "acceptance length / dense")):
        ax.set_xlabel("verify time per step / dense (as measured in the loop)")
        ax.set_ylabel(key)
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.legend(fontsize=7)
    fig.suptitle("LOSSY sparse verification: quality against verify time (fixtures, greedy)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


#: settings of the teacher-forced suite (attention settings that need no calibration: the block rule's budget). Each
#: names its schedule, so a record's setting keeps its meaning when the library's default changes (the default was
#: ``"shared"`` until 2026-12-07: those records are ``attn_shared`` now).
TEACHER_FORCED_SETTINGS = {
    # one selection per row, each block scored by the whole verify window's queries (the default since 2026-12-07)
    "default": DEFAULT,
    "attn_window_rho0.3": LossySparseVerify(attention=SparseAttention(schedule="shared_window", rho=0.3)),
    # paper 000's rule: one selection per row from its first verify token's query
    "attn_shared": LossySparseVerify(attention=SparseAttention(schedule="shared")),
    "attn_rho0.05": LossySparseVerify(attention=SparseAttention(schedule="shared", rho=0.05)),
    "attn_rho0.3": LossySparseVerify(attention=SparseAttention(schedule="shared", rho=0.3)),
    # denser budgets, looking for a near_exact setting (no flips at dense margin >= 1)
    "attn_rho0.5": LossySparseVerify(attention=SparseAttention(schedule="shared", rho=0.5)),
    "attn_rho0.7": LossySparseVerify(attention=SparseAttention(schedule="shared", rho=0.7)),
    # Quest's block score: the bound of q . k from the block's elementwise key minimum and maximum
    "attn_bounds": LossySparseVerify(attention=SparseAttention(schedule="shared", score="bounds")),
    "attn_bounds_rho0.05": LossySparseVerify(attention=SparseAttention(schedule="shared", score="bounds", rho=0.05)),
    # blocks of 16 slots (Quest's page size) for either score, the same token budget
    "attn_b16": LossySparseVerify(attention=SparseAttention(schedule="shared", block_size=16)),
    "attn_bounds_b16": LossySparseVerify(
        attention=SparseAttention(schedule="shared", score="bounds", block_size=16)
    ),
}

#: code-moe's teacher-forced settings: expert skipping that needs no calibration (row_union; code-moe routes each
#: token to 4 of 16 experts, a row of 7 or 8 verify tokens to about 11-12 of them: moe_routing.json)
MOE_TEACHER_FORCED_SETTINGS = {
    "moe_row8": MOE_SETTINGS["moe_row8"],  # a verify row reads its 8 heaviest experts per layer (half)
    "moe_row4": MOE_SETTINGS["moe_row4"],  # its 4 heaviest (a quarter: a token keeps at least its top one)
    "moe_row8_keep2": MOE_SETTINGS["moe_row8_keep2"],  # 8 per row, and every token keeps at least its top two
    "moe_row12": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=12)),
    "moe_row10": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=10)),
    "moe_row11": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=11)),
    "moe_row9": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=9)),
}


def teacher_forced_windows(prompt_file: str, context: int, count: int, positions: int, window: int, tokenizer):
    """``count`` held-out windows of ``context`` tokens as ``(prompt, continuation)``: the last ``positions`` + 1
    tokens before a margin of ``window`` are the continuation (prompt + continuation + one verify step stay inside
    the fixtures' trained 16K positions)."""
    out = []
    for ids in _prompts(prompt_file, context, count, tokenizer):
        ids = ids[:context]
        end = ids.numel() - window
        out.append((ids[: end - positions - 1], ids[end - positions - 1 : end]))
    return out


def run_teacher_forced(args, device) -> list[dict]:
    """The teacher-forced suite (`hf_sparse_verify.drivers.quality`) on code-target at ``--contexts`` (with ``--only
    moe``: code-moe at ``--moe-context``, its expert-skipping settings): one record per (model, context, setting),
    each with its context's noise floor (dense bfloat16 against dense float32 verification)."""
    from hf_sparse_verify.drivers.quality import (
        grant,
        next_line_examples,
        next_line_task,
        paired_delta,
        teacher_forced,
    )

    moe = args.only == "moe"
    name_of_model = "code-moe" if moe else "code-target"
    path = os.path.join(args.models, name_of_model)
    model, tokenizer = _load(path, device, torch.float32)
    reference = _load(path, device, torch.bfloat16)[0]
    long_file = args.prompts_long or os.path.join(args.models, "prompts_long.jsonl")
    files = [os.path.join(args.models, "prompts.jsonl"), long_file]  # each held-out length lives in one of them
    table = MOE_TEACHER_FORCED_SETTINGS if moe else TEACHER_FORCED_SETTINGS
    settings = {k: v for k, v in table.items() if not args.settings or k in args.settings}
    records = []
    for context in [args.moe_context] if moe else args.contexts:
        holding = [f for f in files if _prompts(f, context, 1, tokenizer)]
        if not holding:
            raise SystemExit(f"no held-out window of {context} tokens in {files}")
        windows = teacher_forced_windows(holding[0], context, args.prompts, args.new_tokens, args.k + 1, tokenizer)
        results = teacher_forced(
            model, windows, settings, window=args.k + 1, reference_model=reference, free_running=args.free_running
        )
        floor = results.pop("noise_floor").summary()
        task = {}
        task_context = None
        if args.task_lines:  # next-line completion: lines from held-out prompts longer than the context
            longer = [(f, n) for f, n in ((files[0], 8192), (long_file, 12288), (long_file, 16384)) if n > context]
            texts = [t for f, n in longer for t in _prompts(f, n, 12, tokenizer)]
            task_context, spacing = context, 256
            if not texts:  # no longer windows (16K): prompts of context - margin tokens, lines from the last margin
                texts = _prompts(long_file, 16384, 12, tokenizer)
                task_context, spacing = context - args.task_margin, 32
            examples = next_line_examples(texts, tokenizer, task_context, args.task_lines, spacing=spacing)
            if examples:
                task = next_line_task(model, tokenizer, examples, {"dense": None, **settings}, k=args.k)
        for name, quality in results.items():
            summary = quality.summary()
            scores = dict(em_delta=None, edit_sim_delta=None)  # the task score: None where not measured
            if name in task:
                em, dense_em = ([100 * e for e, _ in task[key]["per_line"]] for key in (name, "dense"))
                sim, dense_sim = ([100 * m for _, m in task[key]["per_line"]] for key in (name, "dense"))
                em_delta, em_ci = paired_delta(em, dense_em)
                sim_delta, sim_ci = paired_delta(sim, dense_sim)
                scores = dict(
                    em=task[name]["em"], em_dense=task["dense"]["em"], em_delta=em_delta, em_delta_ci=em_ci,
                    edit_sim=task[name]["edit_sim"], edit_sim_dense=task["dense"]["edit_sim"],
                    edit_sim_delta=sim_delta, edit_sim_delta_ci=sim_ci, task_lines=task[name]["lines"],
                    task_context=task_context,
                )  # fmt: skip
            measures = dict(summary, **scores, free_running_tokens=args.free_running)
            klass, why = grant(measures)
            records.append(
                dict(
                    setting=name, setting_detail=settings[name].to_dict(), model=name_of_model, context=context,
                    window=args.k + 1, **measures, **{"class": klass}, class_reason=why, noise_floor=floor,
                )  # fmt: skip
            )
            print(json.dumps({k: v for k, v in records[-1].items() if k != "setting_detail"}), flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", required=True, help="folder with code-target, code-draft, code-moe, prompts"
    )
    parser.add_argument("--prompts-long", help="prompts_long.jsonl (default: in --models)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--moe-context", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per context (default: 4)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--calibration-prompts", type=int, default=8)
    parser.add_argument("--calibration-dir", default="calibration")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--only", choices=("dense", "moe"), help="one model only")
    parser.add_argument("--settings", nargs="+", help="subset of settings by name")
    parser.add_argument(
        "--suite",
        choices=("fixtures", "teacher_forced"),
        default="fixtures",
        help="fixtures: free-running generation, dense against each setting; teacher_forced: delta NLL [bootstrap "
        "CI], top-1, KL and flips on held-out continuations through the verify path, with a noise floor, one record "
        "per (model, context, setting), and the precision class the measures grant (use --prompts 12)",
    )
    parser.add_argument(
        "--free-running",
        type=int,
        default=128,
        help="teacher_forced suite: new tokens of each window's free-running generation (prompt lookup, K = --k), "
        "dense and per setting, for the acceptance ratio and copied 4-grams; 0: skip",
    )
    parser.add_argument(
        "--task-lines",
        type=int,
        default=0,
        help="teacher_forced suite: lines of the next-line completion task (exact match and edit similarity, "
        "paired against dense; the issue asks for >= 300) from held-out prompts longer than the context; 0: skip",
    )
    parser.add_argument(
        "--task-margin", type=int, default=1024,
        help="at a context no held-out window is longer than (16K), the task's prompts are this many tokens "
        "shorter and its lines come from the windows' last tokens, 32 tokens apart (records: task_context)",
    )  # fmt: skip
    _records.add_arguments(parser, "sparse_quality")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.suite == "teacher_forced":
        # one record per (model, context, verify window, setting): ``setting`` is the lossy setting's name, as the
        # issue asks; the window (K + 1 tokens per verify row) is part of the key, so a --k run sits beside K = 6's
        key = lambda r: (r.get("suite"), r.get("model"), r.get("context"), r.get("window", 7), r.get("setting"))  # noqa: E731
        for record in run_teacher_forced(args, device):
            record = _records.stamp(dict(record, suite="teacher_forced"), device)
            if args.no_save:
                continue
            data = _records.load(args.json)
            data["records"] = [r for r in data["records"] if key(r) != key(record)] + [record]
            Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        if not args.no_save:
            drawn = os.path.splitext(args.json)[0] + "_teacher_forced.png"
            plot_teacher_forced(_records.load(args.json)["records"], drawn)
        return
    dtype = getattr(torch, args.dtype)
    pick = lambda table: {k: v for k, v in table.items() if not args.settings or k in args.settings}  # noqa: E731
    records = []
    if args.only != "moe":
        draft_path = os.path.join(args.models, "code-draft")
        draft = _load(draft_path, device, dtype)[0] if os.path.isdir(draft_path) else None
        long_file = args.prompts_long or os.path.join(args.models, "prompts_long.jsonl")
        records += run_model(
            "code-target", os.path.join(args.models, "code-target"), long_file, args.contexts,
            pick(DENSE_SETTINGS), args, device, dtype, draft,
        )  # fmt: skip
    if args.only != "dense" and os.path.isdir(os.path.join(args.models, "code-moe")):
        records += run_model(
            "code-moe", os.path.join(args.models, "code-moe"), os.path.join(args.models, "prompts.jsonl"),
            [args.moe_context], pick(MOE_SETTINGS), args, device, dtype,
        )  # fmt: skip
    result = dict(
        machine=machine_info(device),
        method="greedy, same drafter and K for dense and sparse verification; agreement is position-wise over the "
        "new tokens; NLL under the plain dense model; FLOPs/bytes nominal from the setting's budgets",
        records=records,
    )
    _records.save(args, result, device, setting="fixtures")
    plot(records, os.path.splitext(args.json)[0] + ".png")


if __name__ == "__main__":
    main()
