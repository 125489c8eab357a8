"""LOSSY sparse verification end to end: whole ``generate`` calls with a lossy setting beside the same drafter
with dense verification, side by side in one process (`bench_e2e.run_shape`: one warm-up call per case, then
``--repeats`` interleaved rounds, the median call kept; decode tokens/s = new tokens after each row's first /
(wall - prefill - graph capture)).

Per (shape, drafter, setting) one record: ``setting``, ``class`` (the setting's precision class at the shape's
context bucket, from ``results/sparse_quality.json``; ``"ungraded"`` where it has none), ``strategy``, ``k_policy``,
``num_draft_tokens``, ``batch``, ``context``, ``decode_tokens_per_s``, ``dense_decode_tokens_per_s``, ``vs_dense``,
both acceptance lengths, both verify ms per step, ``step_ms`` / ``dense_step_ms`` (decode ms per step) and
``vs_dense_per_step`` (their ratio: what the setting does to a step's speed, apart from acceptance, which a lossy
setting also moves by changing the output: papers/000's warning), both e2e records' scalar fields, ``device``,
``commit``. Settings are the names of
`bench_sparse_quality.TEACHER_FORCED_SETTINGS` (where their quality is measured).

    python benchmarks/bench_sparse_e2e.py --shapes 4x16384 16x16384 --drafters prompt_lookup:4 draft_model:4 \\
        --settings default attn_shared

(Vegas cannot verify with sparse attention: it ranks cached tokens by the verify pass's full attention, and the
library refuses the pair.)

Writes ``results/sparse_e2e.json`` (a record per ``case`` ``<device>:<B>x<L>:<drafter>+<setting>``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _records  # noqa: E402
from benchmarks.bench_e2e import load_models, lossy_setting, run_shape  # noqa: E402
from hf_sparse_verify.drivers.machine import commit  # noqa: E402

QUALITY = Path(__file__).resolve().parent / "results" / "sparse_quality.json"


def quality_class(name: str, context: int, quality_records: list[dict]) -> tuple[str, int | None]:
    """The class of setting ``name`` at ``context``'s bucket (the smallest graded context >= ``context``; the
    largest graded one beyond them) and that bucket's context; ``("ungraded", None)`` where none is recorded."""
    graded = sorted(
        (r["context"], r["class"]) for r in quality_records
        if r.get("setting") == name and r.get("model") == "code-target" and r.get("class")
    )  # fmt: skip
    if not graded:
        return "ungraded", None
    above = [g for g in graded if g[0] >= context]
    bucket, klass = above[0] if above else graded[-1]
    return klass, bucket


def step_ms(record: dict) -> float:
    """Decode milliseconds per step of a `bench_e2e` record (wall - prefill - capture over the batch's steps):
    the speed of a step whatever the acceptance, which a lossy setting can move by changing the output."""
    return 1000 * (record["wall_s"] - record["prefill_s"] - record["capture_s"]) / max(record["steps"], 1)


def _brief(record: dict) -> dict:
    """A `bench_e2e` record's scalar fields (step parts, host time, capture) kept beside the comparison."""
    return {k: v for k, v in record.items() if not isinstance(v, (list, dict))}


def sparse_records(shape_results: list[tuple[str, dict]], quality_records: list[dict]) -> list[tuple[str, dict]]:
    """``(setting, record)`` per lossy case of one shape's `run_shape` results, against its dense twin."""
    dense = {
        (r["strategy"], r["k_policy"], r["num_draft_tokens"]): r for _, r in shape_results if not r.get("lossy")
    }
    out = []
    for key, r in shape_results:
        if not r.get("lossy"):
            continue
        twin = dense.get((r["strategy"], r["k_policy"], r["num_draft_tokens"]))
        if twin is None:
            raise SystemExit(f"{key}: its dense twin did not run")
        klass, bucket = quality_class(r["lossy"], r["context"], quality_records)
        out.append((key, dict(
            setting=r["lossy"], setting_detail=lossy_setting(r["lossy"]).to_dict(), **{"class": klass},
            class_context=bucket, strategy=r["strategy"], k_policy=r["k_policy"],
            num_draft_tokens=r["num_draft_tokens"], batch=r["batch"], context=r["context"],
            new_tokens=r["new_tokens"], decode_tokens_per_s=r["decode_tokens_per_s"],
            dense_decode_tokens_per_s=twin["decode_tokens_per_s"],
            vs_dense=r["decode_tokens_per_s"] / twin["decode_tokens_per_s"],
            mean_acceptance_length=r["mean_acceptance_length"],
            dense_mean_acceptance_length=twin["mean_acceptance_length"],
            verify_ms=r["verify_ms"], dense_verify_ms=twin["verify_ms"], draft_ms=r["draft_ms"],
            dense_draft_ms=twin["draft_ms"], steps=r["steps"], dense_steps=twin["steps"],
            decode_tokens_per_s_all=r["decode_tokens_per_s_all"],
            dense_decode_tokens_per_s_all=twin["decode_tokens_per_s_all"], vs_k0=r["vs_k0"],
            step_ms=step_ms(r), dense_step_ms=step_ms(twin), vs_dense_per_step=step_ms(twin) / step_ms(r),
            e2e=_brief(r), dense_e2e=_brief(twin), device=r["device"], commit=commit(),
        )))  # fmt: skip
    return out


def plot(records: list[dict], path: str) -> str:
    """Each lossy case drawn beside its dense twin: decode tokens/s over dense's per call and per step (bars, one
    group per shape, drafter and run), labelled with the setting's class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(records, key=lambda r: (r["batch"], r["context"], r["strategy"], r.get("run", ""), r["setting"]))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows)), 4.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["vs_dense"] for r in rows], 0.4, label="per call (decode tokens/s)")
    per_step = [r.get("vs_dense_per_step") or 0.0 for r in rows]
    ax.bar([i + 0.2 for i in x], per_step, 0.4, label="per step (decode ms per step)")
    labels = [
        f"{r['batch']}x{r['context'] // 1024}K {r['strategy']}\n{r['setting']} ({r['class']}) {r.get('run', '')}"
        for r in rows
    ]
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=6)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.axhline(1.25, color="tab:blue", lw=0.5, ls="--")
    ax.set_ylabel("LOSSY / dense twin")
    ax.set_title("LOSSY sparse verification end to end (code-target fixtures; dashed: issue 40's 1.25x; "
                 "per step missing: not measured)", fontsize=8)  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["4x16384", "16x16384"])
    parser.add_argument("--drafters", nargs="+", default=["prompt_lookup:4", "draft_model:4"], help="bench_e2e cases")
    parser.add_argument("--settings", nargs="+", default=["default"], help="lossy settings, by name")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--plot", action="store_true", help="only draw the results file (--json) to sparse_e2e.png")
    _records.add_arguments(parser, "sparse_e2e")
    args = parser.parse_args(argv)
    if args.plot:
        print(plot(_records.load(args.json)["records"], str(Path(args.json).with_suffix(".png"))))
        return
    for name in args.settings:
        lossy_setting(name)  # unknown names fail before the models load
    quality = _records.load(QUALITY)["records"]
    tokenizer, target, draft = load_models(args.shared, args.device, getattr(torch, args.dtype) if args.dtype else None)
    prompts_path = Path(args.shared) / "models" / "prompts_long.jsonl"
    cases = ["k0"] + [c for d in args.drafters for c in [d, *(f"{d}+{s}" for s in args.settings)]]
    for shape in args.shapes:
        results = run_shape(target, draft, tokenizer, prompts_path, shape, cases, args.new_tokens, args.device,
                            repeats=args.repeats)  # fmt: skip
        for _, record in results:
            record.pop("trace", None)
        for key, record in sparse_records(results, quality):
            print(json.dumps({k: v for k, v in record.items() if not isinstance(v, (list, dict))}), flush=True)
            if not args.no_save:  # one record per case (``setting`` names the lossy setting, shared by cases)
                record = _records.stamp(dict(record, case=key), args.device)
                path = _records.add(args.json, record, benchmark="sparse_e2e", key="case")
                print(f"wrote record {key!r} to {path}")


if __name__ == "__main__":
    main()
