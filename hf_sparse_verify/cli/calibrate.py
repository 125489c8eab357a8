"""``hf-sparse-verify calibrate``: calibration of LOSSY sparse verification (anchor layers, FFN thresholds, expert
skipping) for one model, written as ``sparse_verify_calibration.json``."""

from __future__ import annotations

from . import _common as common
from ._common import UsageError

#: where ``calibrate`` writes without ``--out`` (never into the model's folder, which may be an installed package)
DEFAULT_OUT = "calibration"


def add_parser(sub, parents) -> None:
    cal = sub.add_parser(
        "calibrate",
        parents=parents,
        help="calibrate LOSSY sparse verification (anchor layers, FFN thresholds, expert skipping) for a model",
        description="Runs the prompts through the model (prefill, then one dense verify step of the last "
        "--verify-tokens tokens each) and writes sparse_verify_calibration.json: per-layer block-selection "
        "similarities (anchor layers), FFN activation thresholds for channel sparsities 0.05..0.95, and for MoE "
        "models expert-skipping threshold maps, refusing a setting whose NLL damage passes --moe-max-damage.",
    )
    cal.add_argument("--model", help="model folder or Hub id (default: the embedded demo target)")
    cal.add_argument(
        "--prompt-file", required=True, metavar="FILE", help='text file or .jsonl with {"text": ...}'
    )
    cal.add_argument(
        "--prompt-len", type=common.positive_int, help="keep only .jsonl lines whose 'len' equals this"
    )
    cal.add_argument("--max-prompts", type=common.positive_int, default=16, help="(default: 16)")
    cal.add_argument(
        "--max-tokens",
        type=common.positive_int,
        default=8192,
        help="cut prompts to this many tokens (default: 8192)",
    )
    cal.add_argument(
        "--verify-tokens", type=common.positive_int, default=8, help="verify tokens per prompt (default: 8)"
    )
    cal.add_argument(
        "--block-size", type=common.positive_int, default=64, help="attention block size (default: 64)"
    )
    cal.add_argument("--rho", type=common.probability, default=0.1, help="attention rho (default: 0.1)")
    cal.add_argument("--dense-below", type=int, default=4096, help="attention L0 (default: 4096)")
    cal.add_argument("--no-ffn", action="store_true", help="skip the FFN thresholds")
    cal.add_argument(
        "--moe-rule",
        default="threshold",
        choices=("threshold", "budget", "row_union"),
        help="(default: threshold)",
    )
    cal.add_argument(
        "--moe-row-experts",
        type=common.positive_int,
        help="experts per verify row for --moe-rule row_union (e.g. 8)",
    )
    cal.add_argument(
        "--moe-max-skip", type=common.positive_int, default=1, help="experts skipped at most (default: 1)"
    )
    cal.add_argument(
        "--moe-max-damage", type=common.positive_float, default=0.05, help="NLL bound (default: 0.05)"
    )
    cal.add_argument(
        "--grade",
        action="store_true",
        help="also grade candidate attention settings (rho = --rho, 0.3, 0.5, 0.7; for MoE models first row_union "
        "expert skipping at 0.7 / 0.8 / 0.9 of the experts a row reaches) teacher-forced on the prompts' last "
        "--grade-tokens tokens against dense verification, and write each one's precision class (near_exact / "
        "balanced / fast) as the calibration's grades; pass the folder as quality_calibration",
    )
    cal.add_argument(
        "--grade-tokens", type=common.positive_int, default=64, help="scored tokens per prompt (default: 64)"
    )
    cal.add_argument(
        "--grade-free-running",
        type=int,
        default=0,
        help="new tokens per prompt for the acceptance-ratio gate of balanced (default: 0, not measured)",
    )
    cal.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available, else cpu)")
    cal.add_argument("--dtype", choices=common.DTYPES, help="(default: float32 on CPU, bfloat16 on GPU)")
    cal.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"output folder (default: ./{DEFAULT_OUT}); pass it as lossy_sparse_verify.calibration",
    )


def run(args) -> int:
    prompts = common.tuning_prompts(args)
    common.check_model("--model", args.model)
    device = common.device(args.device)

    from ..drivers.calibrate import calibrate
    from ..integrations import replaceable_mlp
    from ..sparse import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE

    dtype_name = common.default_dtype(args.dtype, device)
    model_path = args.model or common.demo_model("target")
    out = args.out

    tokenizer, model = common.load_model("--model", model_path, dtype_name, device)
    ids = [tokenizer(p, return_tensors="pt")["input_ids"][0, : args.max_tokens] for p in prompts]
    ids = [t for t in ids if t.numel() > args.verify_tokens]
    if not ids:
        raise UsageError(f"--prompt-file: no prompt longer than --verify-tokens={args.verify_tokens} tokens")
    is_moe = getattr(model.config.get_text_config(), "num_experts_per_tok", None) is not None
    has_ffn = any(replaceable_mlp(m) for m in model.modules())
    try:
        cfg = LossySparseVerify(
            attention=SparseAttention(block_size=args.block_size, rho=args.rho, dense_below=args.dense_below),
            ffn=SparseFFN() if has_ffn and not args.no_ffn else None,
            moe=SparseMoE(
                rule=args.moe_rule,
                max_skip=args.moe_max_skip,
                row_experts=args.moe_row_experts,
                max_damage=args.moe_max_damage,
            )
            if is_moe
            else None,
        )
        result = calibrate(model, ids, cfg, verify_tokens=args.verify_tokens)
        if args.grade:
            result.grades = _grades(args, model, ids, result)
    except ValueError as err:
        raise UsageError(common.one_line(err)) from err
    path = result.save(out)
    anchors = result.anchor_layers(cfg.attention)
    print(f"{len(ids)} prompt(s), {model_path}, {device} {dtype_name}")
    print(f"anchor layers (a quarter of {result.num_layers}): {anchors}")
    if result.ffn:
        taus = result.ffn_thresholds(SparseFFN(sparsity=0.5))
        print("ffn tau at sparsity 0.5: " + " ".join(f"{t:.3g}" for t in taus if t is not None))
    if result.moe:
        print(f"moe damage: {result.moe.get('damage')}")
    for g in result.grades or ():
        m = g["measures"]
        print(
            f"grade {g['name']}: {g['class']} (delta NLL {m['delta_nll_pct']:+.2f}%, top-1 {m['top1']:.3f}, "
            f"KL {m['kl']:.4f}, flips {m['flips_margin1']}, {m['positions']} positions)"
            + (f"; not higher: {g['why_not_higher']}" if g["why_not_higher"] else "")
        )
    print(f"saved {path}; use it with lossy_sparse_verify={{..., 'calibration': {out!r}}}")
    if result.grades:
        print(f"or with precision='near_exact' / 'balanced' and quality_calibration={out!r}")
    return 0


#: shares of the distinct experts a verify row reaches under a uniform router that the graded ``row_union``
#: candidates keep (code-moe, 8-token rows, graded with the task score: 10 of 16 per row, 0.69 of 14.4, balanced;
#: 12, 0.83, near_exact). `--grade` measures no task score, so it grants these near_exact or fast only
MOE_ROW_SHARES = (0.7, 0.8, 0.9)


def _moe_candidates(model, verify_tokens: int, attention) -> dict:
    """For a model with routed experts: ``row_union`` expert skipping at `MOE_ROW_SHARES` of the experts a row of
    ``verify_tokens`` tokens reaches under a uniform router (sparsest first, each token keeping at least its top
    expert), with ``attention`` (dense below its ``dense_below``, so at short contexts only the experts are skipped).
    Empty for other models."""
    from ..drivers.shapes import expected_experts
    from ..sparse import LossySparseVerify, SparseMoE

    config = model.config.get_text_config()
    k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not k or k < 2 or not experts or k >= experts:  # one routed expert per token: nothing to skip
        return {}
    reached = expected_experts(experts, k, verify_tokens)
    rows = sorted({min(experts - 1, max(k, round(share * reached))) for share in MOE_ROW_SHARES})
    out = {}
    for row in rows:
        name = f"experts {row} of {experts} per row (row_union), attention rho {attention.rho}, window-scored"
        moe = SparseMoE(rule="row_union", max_skip=k - 1, row_experts=row)
        out[name] = LossySparseVerify(attention=attention, moe=moe)
    return out


def _grades(args, model, ids, calibration) -> list[dict]:
    """Attention settings at ``--rho``, 0.3, 0.5 and 0.7 (sparsest first: `SparseCalibration.granted` takes the
    first that qualifies), at ``--rho`` and 0.3 also with ``schedule="shared_window"`` (first: the same blocks read,
    less damage), graded on each prompt's last ``--grade-tokens`` in verify rows of ``--verify-tokens``. On
    code-target rho 0.7 was the one that passed near_exact at 8K and 16K, and the window-scored rho 0.1 cut the
    default's damage at 16K from +1.79% to +0.22% NLL (docs/results.md). A model with routed experts gets
    `_moe_candidates` first (expert skipping with the window-scored ``--rho`` attention): they save at any
    context."""
    from ..drivers.quality import grade
    from ..sparse import LossySparseVerify, SparseAttention

    windows = [
        (t[: -args.grade_tokens], t[-args.grade_tokens :]) for t in ids if t.numel() > args.grade_tokens + 1
    ]
    if not windows:
        raise ValueError(f"--grade needs prompts longer than --grade-tokens={args.grade_tokens} tokens")
    window_scored = SparseAttention(
        block_size=args.block_size, rho=args.rho, dense_below=args.dense_below, schedule="shared_window"
    )
    candidates = _moe_candidates(model, args.verify_tokens, window_scored)
    for rho in sorted({args.rho, 0.3, 0.5, 0.7}):
        schedules = ("shared_window", "shared") if rho in (args.rho, 0.3) else ("shared",)
        for schedule in schedules:
            name = f"attention rho {rho}" + (", window-scored" if schedule == "shared_window" else "")
            candidates[name] = LossySparseVerify(
                attention=SparseAttention(
                    block_size=args.block_size, rho=rho, dense_below=args.dense_below, schedule=schedule
                )
            )
    return grade(
        model, windows, candidates, calibration, window=args.verify_tokens, free_running=args.grade_free_running
    )
