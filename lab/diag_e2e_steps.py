"""Diagnostic: per-step draft / verify / update times of one whole generate call on the trained fixtures, to find
where a constant-K call loses time against the K = 0 path (which steps, which widths, graph replay or eager).

    python lab/diag_e2e_steps.py --shape 16x16384 --case prompt_lookup:4 --new-tokens 256 --out steps.json
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hf_sparse_verify as hsv  # noqa: E402
from benchmarks.bench_e2e import prompts  # noqa: E402
from hf_sparse_verify.generation.engine.sessions import SESSIONS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="16x16384")
    parser.add_argument("--cases", nargs="+", default=["k0", "prompt_lookup:4"])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--shared", default="/tmp/shared")
    parser.add_argument("--out", default="steps.json")
    args = parser.parse_args()
    models = Path(args.shared) / "models"
    tok = AutoTokenizer.from_pretrained(models / "code-target")
    target = AutoModelForCausalLM.from_pretrained(models / "code-target", dtype=torch.bfloat16).cuda().eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "code-draft", dtype=torch.bfloat16).cuda().eval()
    batch, context = (int(x) for x in args.shape.split("x"))
    ids = prompts(models / "prompts_long.jsonl", tok, batch, context, "cuda")
    out_all = {}
    for case in args.cases:
        name, _, k = case.partition(":")
        if name == "k0":
            spec = dict(strategy="prompt_lookup", k_policy="plain")
        elif k in ("utility",):
            spec = dict(strategy=name, k_policy=k)
        elif name == "auto":
            spec = dict(strategy="auto")
        else:
            spec = dict(strategy=name, num_draft_tokens=int(k))
        kwargs = dict(custom_generate=hsv.generate, speculation=spec, return_dict_in_generate=True)
        if name in ("draft_model", "auto"):
            kwargs["draft_model"] = draft
        for call in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = target.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                    do_sample=False, **kwargs,
                )
            s = out.speculation
            parts = [[round(1000 * x, 3) for x in p] for p in s.step_parts_s]
            active = [sum(a is not None for a in row) for row in s.accepted_tokens]
            graph_keys = []
            for session in SESSIONS.sessions.values():
                graphs = session.target.graphs
                graph_keys.append(sorted(str(key[:2]) for key in graphs.graphs) if graphs else None)
            out_all[f"{case}#{call}"] = dict(
                steps=s.steps, k=s.draft_tokens, parts_ms=parts, active=active, new_tokens=s.new_tokens,
                prefill_s=s.prefill_time_s, capture_s=s.graph_capture_s, wall_s=s.wall_time_s,
                warnings=[str(w.message)[:300] for w in caught], graph_keys=graph_keys,
                policy_states=s.policy_states[-3:] if s.policy_states else None,
            )
            verify = sorted(p[1] for p in parts)
            print(case, call, "steps", s.steps, "verify ms median", verify[len(verify) // 2], "max", verify[-1],
                  "mean", round(sum(verify) / len(verify), 3), "warnings", len(caught))
            print("  first 12 verify ms", [p[1] for p in parts[:12]], "last 12", [p[1] for p in parts[-12:]])
            print("  active rows last 12", active[-12:], "k last 12", s.draft_tokens[-12:])
    Path(args.out).write_text(json.dumps(out_all))


if __name__ == "__main__":
    main()
