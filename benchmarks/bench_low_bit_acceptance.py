"""Acceptance of a low-bit copy of the target as its own draft (issue 39): the trained code-target fixture drafting
for itself with its linear layers rounded through int8 (per output channel) or int4 (per group of input channels),
its full KV cache, greedy, constant K; against the unrounded copy, which has every draft accepted.

Acceptance is a property of the weights, not of the machine's speed: it runs on a CPU in float32 (where output
equality is exact) as well as on a GPU. Per (context, K, weights): mean tokens per step (``mean_acceptance_length``,
K + 1 at most), drafts accepted over drafts proposed (``accepted_per_draft``), and ``vs_full`` (the mean acceptance
length over the unrounded copy's, which is K + 1). ``draft_weight_bytes``: the rounded layers' bytes once packed,
against the same layers in bf16.

    python benchmarks/bench_low_bit_acceptance.py --contexts 1024 8192 --ks 4 6 8 --prompts 4 --new-tokens 64

``--rounding absmax`` rounds each group's largest magnitude to the format's largest value (the records before
2026-12-07 late); ``mse`` (default) picks the scale of least squared error (`kernels.low_bit.naive.quantize`; the
setting ends in ``:mse``). With ``--round-head`` the copies' output head is rounded too (fake-quantized: the acceptance an int4 / int8 head
would give; the record's setting ends in ``:head``). With ``--strategy vegas`` the draft is Vegas (the target over its selected cache) with its draft steps on the model's
own weights (``full``) or on the rounded copy (``SpeculationConfig.draft_weights``), and ``vs_full`` compares the
two at the same K and context (the issue's gate: int4 >= 0.9x); the record's setting ends in ``:vegas``.

Writes one record per device and int4 group size to ``results/low_bit_acceptance.json`` (setting
``<device>:<group_size>``) and draws ``results/low_bit_acceptance_g<group_size>.png``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hf_sparse_verify as hsv  # noqa: E402
from benchmarks import _records  # noqa: E402
from benchmarks.bench_e2e import _prompt_ids  # noqa: E402
from hf_sparse_verify.generation.drafters import low_bit as low_bit_drafts  # noqa: E402
from hf_sparse_verify.generation.drafters.low_bit import low_bit_bytes, low_bit_copy  # noqa: E402
from hf_sparse_verify.kernels.low_bit import fake_quantize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = ["full", "int8", "int4"]


def acceptance(
    target, draft, prompts: list[list[int]], k: int, new_tokens: int, device, speculation: dict | None = None
) -> dict:
    """Greedy calls at constant K over ``prompts`` (one row each): the ``draft_model`` strategy with ``draft``, or
    the given ``speculation`` settings; mean tokens per step and drafts accepted over proposed, pooled over the
    calls."""
    steps = tokens = accepted = proposed = 0
    for ids in prompts:
        ids = torch.tensor([ids], device=device)
        settings = dict(speculation or dict(strategy="draft_model"), num_draft_tokens=k, max_draft_tokens=k)
        out = target.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
            custom_generate=hsv.generate, draft_model=draft if speculation is None else None,
            return_dict_in_generate=True, speculation=settings,
        )  # fmt: skip
        s = out.speculation
        steps += s.steps
        tokens += sum(s.new_tokens) - 1  # the prefill's token is not a step's
        accepted += sum(a for row in s.accepted_tokens for a in row if a is not None)
        proposed += sum(p for row in s.proposed_tokens for p in row if p is not None)
    return dict(
        mean_acceptance_length=tokens / steps if steps else None,
        accepted_per_draft=accepted / proposed if proposed else None,
        steps=steps,
    )


def rounded_head(head: torch.nn.Linear, weights: str, group_size: int, rounding: str) -> torch.nn.Linear:
    """An untied ``nn.Linear`` with ``head``'s weight rounded through ``weights`` and back (`fake_quantize`): what a
    low-bit output head computes, for acceptance only (its speed is not what this measures)."""
    rounded = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    rounded = rounded.to(device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        rounded.weight.copy_(fake_quantize(head.weight, weights, group_size, rounding))
        if head.bias is not None:
            rounded.bias.copy_(head.bias)
    return rounded


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({r["context"] for r in record["rows"]})
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.5 * len(contexts), 3.6), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        rows = [r for r in record["rows"] if r["context"] == context]
        ks = sorted({r["k"] for r in rows})
        for i, weights in enumerate(WEIGHTS):
            found = {r["k"]: r["mean_acceptance_length"] for r in rows if r["draft_weights"] == weights}
            values = [found.get(k, 0) for k in ks]
            ax.bar([x + (i - 1) * 0.27 for x in range(len(ks))], values, 0.27, label=weights)
        ax.set_xticks(range(len(ks)), [f"K = {k}" for k in ks])
        ax.set_title(f"context {context}")
        ax.set_ylabel("tokens per step")
    axes[0][0].legend()
    machine = record["machine"]
    what = (
        "Vegas drafting on low-bit weights (full: the model's own)"
        if record.get("strategy") == "vegas"
        else "low-bit self-draft acceptance"
    )
    fig.suptitle(f"{what}, code-target, {machine.get('gpu') or 'cpu'}, commit {machine.get('commit')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--prompts", type=int, default=4, help="held-out prompts per context (one row each)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=128, help="int4: input channels per scale")
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"), help="folder holding models/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--strategy", default="draft_model", choices=("draft_model", "vegas"))
    parser.add_argument(
        "--round-head", action="store_true",
        help="draft_model strategy: round the copies' output head too (fake-quantized, untied; what an int4 / int8 "
        "head would compute), to see what it costs in acceptance",
    )  # fmt: skip
    parser.add_argument(
        "--rounding", default="mse", choices=("absmax", "mse"),
        help="how the copies' scales are picked (LowBitLinear; the records without a :mse suffix are absmax)",
    )  # fmt: skip
    _records.add_arguments(parser, "low_bit_acceptance")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    models = Path(args.shared) / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "code-target")
    target = (
        AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=torch.float32)
        .to(args.device)
        .eval()
    )
    drafts = {"full": target}
    for weights in WEIGHTS[1:]:
        drafts[weights] = low_bit_copy(target, weights, args.group_size, rounding=args.rounding)
        # the copy Vegas' `draft_weights` takes (`low_bit_draft_for` makes it once per target and keeps it)
        low_bit_drafts._COPIES.setdefault(target, {})[(weights, args.group_size)] = drafts[weights]
    if args.round_head:
        if args.strategy != "draft_model":
            raise SystemExit("--round-head applies to the draft_model strategy's copies")
        for weights in WEIGHTS[1:]:
            drafts[weights].lm_head = rounded_head(target.lm_head, weights, args.group_size, args.rounding)
    texts = _prompt_ids(models / "prompts_long.jsonl", tokenizer)
    rows = []
    jobs = [(c, k, w) for c in args.contexts for k in args.ks for w in WEIGHTS]
    for context, k, weights in tqdm(jobs, desc="low-bit acceptance"):
        prompts = [list(x[:context]) for x in texts if len(x) >= context][: args.prompts]
        if not prompts:
            raise SystemExit(f"no prompt of {context} tokens in {models / 'prompts_long.jsonl'}")
        if args.strategy == "vegas":
            low_bit = (
                {} if weights == "full" else dict(draft_weights=weights, draft_weight_group=args.group_size)
            )
            spec = dict(strategy="vegas", **low_bit)
            result = acceptance(target, None, prompts, k, args.new_tokens, args.device, spec)
        else:
            result = acceptance(target, drafts[weights], prompts, k, args.new_tokens, args.device)
        rows.append(dict(context=context, k=k, draft_weights=weights, prompts=len(prompts), **result))
    for row in rows:
        full = next(
            r
            for r in rows
            if (r["context"], r["k"], r["draft_weights"]) == (row["context"], row["k"], "full")
        )
        row["vs_full"] = row["mean_acceptance_length"] / full["mean_acceptance_length"]
        print(row)
    bf16 = (
        low_bit_bytes(target, "int8", args.group_size)["original"] // 2
    )  # float32 weights, 2 bytes each in bf16
    record = dict(
        model="code-target",
        strategy=args.strategy,
        dtype="float32",
        new_tokens=args.new_tokens,
        group_size=args.group_size,
        draft_weight_bytes={w: low_bit_bytes(target, w, args.group_size)["low_bit"] for w in WEIGHTS[1:]}
        | {"bf16": bf16},
        rows=rows,
        round_head=args.round_head,
        rounding=args.rounding,
    )
    device_name = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else "cpu"
    suffix = ("" if args.strategy == "draft_model" else f":{args.strategy}") + (
        ":head" if args.round_head else ""
    )
    suffix += (
        "" if args.rounding == "absmax" else f":{args.rounding}"
    )  # the records before "mse" have no suffix
    path = _records.save(args, record, args.device, setting=f"{device_name}:{args.group_size}{suffix}")
    if path is not None:
        # a record named with --setting draws its own PNG (not over the default setting's)
        tail = args.setting if args.setting else f"g{args.group_size}{suffix}"
        name = f"{path.stem}_{tail.replace(':', '_')}.png"
        plot(_records.stamp(record, args.device), path.with_name(name))


if __name__ == "__main__":
    main()
