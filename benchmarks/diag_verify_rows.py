"""Up to how many token rows should verify steps take our fused projection kernels (``qkv_proj`` and the fused
``silu(gate) * up``) instead of torch's matmuls? A side-by-side step timing on one model, row limits patched between
runs (the library reads `modules.mlp.FUSED_MAX_ROWS` and `kernels.qkv_rope.MAX_ROWS` at call time).

A self-speculation verify step at 4 x 64K with K = 6 has 28 token rows: above the limit of 16, so its q/k/v, gate
and up projections run as cuBLAS GEMMs. This times `hf-sparse-verify bench step` (captured graphs, random bf16
8B shape, random cache, with and without Vegas score collection) at each limit.

    python benchmarks/diag_verify_rows.py --limits 16 32 --batch 4 --context 65536 --new-tokens 1 5 7 9 \\
        --json benchmarks/results/h200_diag_verify_rows.json
"""

from __future__ import annotations

import argparse
import json

import torch

from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.shapes import random_model
from hf_sparse_verify.drivers.step_bench import StepBenchArgs, run_on
from hf_sparse_verify.kernels.qkv_rope import op as qkv_op
from hf_sparse_verify.integrations import qkv_attention as attention_module
from hf_sparse_verify.integrations import mlp as mlp_module


def set_row_limit(rows: int) -> None:
    """The fused projections' row limit for this process (a diagnostic knob, not an API)."""
    qkv_op.MAX_ROWS = rows
    attention_module.MAX_ROWS = rows
    mlp_module.FUSED_MAX_ROWS = rows


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", nargs="+", type=int, default=[16, 32])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--batch", nargs="+", type=int, default=[4])
    parser.add_argument("--context", nargs="+", type=int, default=[65536])
    parser.add_argument("--new-tokens", nargs="+", type=int, default=[1, 5, 7, 9])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2, help="every limit this many times, interleaved")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    model = random_model(args.shape, device, torch.bfloat16)
    bench = StepBenchArgs(
        shape=args.shape, contexts=tuple(args.context), new_tokens=tuple(args.new_tokens),
        batches=tuple(args.batch), repeats=args.repeats, transformers=False, vegas_scores=True,
    )  # fmt: skip
    runs, result = [], None
    for round_ in range(args.rounds):
        for limit in args.limits:
            set_row_limit(limit)
            try:
                result = run_on(model, bench, device)
            except (
                Exception
            ) as err:  # e.g. a tile that needs more shared memory than the GPU has at this limit
                runs.append(
                    dict(round=round_, row_limit=limit, error=f"{type(err).__name__}: {str(err)[:200]}")
                )
                print(json.dumps(runs[-1]), flush=True)
                torch.cuda.empty_cache()
                continue
            for r in result["records"]:
                row = dict(round=round_, row_limit=limit, rows=r["batch"] * r["new_tokens"], **r)
                runs.append(row)
                print(json.dumps(row), flush=True)
    set_row_limit(16)
    out = dict(
        machine=machine_info(device),
        args=vars(args),
        method=result["method"] if result else None,
        records=runs,
    )
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
