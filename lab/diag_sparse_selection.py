"""Is block SELECTION what breaks LOSSY sparse verification at 16K on the fixture? Teacher-forced logit error of
sparse verify attention under several block-scoring rules at the same budget, against dense attention.

Per held-out prompt (same trimming as `bench_sparse_quality.py`) the dense model's greedy continuation is computed;
then every window of ``--k + 1`` continuation tokens is verified over the cache of everything before it, once
densely and once per rule, in plain PyTorch (float32, CPU is fine). Every layer and KV head attends to the sink
block, the ``local_blocks`` blocks before the window, the window itself and its top-scoring other blocks, up to the
budget of `SparseAttention` (the sparse-verification paper §3.2); the rules differ only in the block scores:

- ``mean``: the first window query against the block's mean key, summed over the KV head's query heads (what the
  library does: the sparse-verification paper Eq. 5);
- ``bound``: Quest's upper bound of that dot product from the block's per-channel key min and max;
- ``oracle_first``: the first window query's true softmax mass in the block (what ``mean`` approximates);
- ``oracle_all``: the true mass of every window query (an upper bound for one shared selection).

Reported per rule: argmax flips against dense over all window positions, flips where the dense top-2 margin is
below 0.25 (where free-running agreement is decided), and the mean / max absolute logit error.

    python benchmarks/diag_sparse_selection.py --models ../shared/models --contexts 16384 --prompts 3 \\
        --out benchmarks/results/sparse_selection_rules.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from tqdm import tqdm
from transformers import AttentionInterface, DynamicCache

from benchmarks.bench_sparse_quality import _load, _prompts
from hf_sparse_verify._compat import CACHE_KWARG
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.sparse import SparseAttention

RULES = ("dense", "mean", "bound", "oracle_first", "oracle_all")
NAME = "hsv_selection_study"


class Study:
    """What the registered attention function reads: the rule of the current forward and the budget."""

    rule = "dense"
    cfg = SparseAttention()


def _block_scores(rule: str, query: torch.Tensor, key: torch.Tensor, prefix: int, block: int, scale: float):
    """Scores ``[B, H_kv, n]`` of the ``n`` whole-or-partial blocks of the first ``prefix`` keys."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    group = h // h_kv
    keys = key[:, :, :prefix]
    n = -(-prefix // block)
    pad = n * block - prefix
    qg = query.float().view(b, h_kv, group, q_len, d)
    if rule in ("oracle_first", "oracle_all"):
        rows = qg[:, :, :, :1] if rule == "oracle_first" else qg
        logits = torch.einsum("bkgqd,bkld->bkgql", rows, key.float()) * scale
        # the window's own keys are causal for later rows; mass over the prefix only matters for ranking
        probs = logits.softmax(dim=-1)[..., :prefix]
        mass = torch.nn.functional.pad(probs, (0, pad)).view(b, h_kv, group, rows.shape[3], n, block).sum(-1)
        return mass.sum(dim=(2, 3))
    padded = torch.nn.functional.pad(keys.float(), (0, 0, 0, pad))
    blocks = padded.view(b, h_kv, n, block, d)
    q0 = qg[:, :, :, 0]  # [B, H_kv, G, D]
    if rule == "mean":
        counts = torch.full((n,), block, dtype=torch.float32)
        counts[-1] = block - pad
        mean = blocks.sum(dim=3) / counts[:, None]
        return torch.einsum("bkgd,bknd->bkn", q0, mean)
    if rule == "bound":
        valid = torch.arange(n * block).view(n, block) < prefix
        lo = blocks.masked_fill(~valid[None, None, :, :, None], float("inf")).amin(dim=3)
        hi = blocks.masked_fill(~valid[None, None, :, :, None], float("-inf")).amax(dim=3)
        q = q0[:, :, :, None, :]  # [B, H_kv, G, 1, D]
        return torch.maximum(q * lo[:, :, None], q * hi[:, :, None]).sum(dim=-1).sum(dim=2)
    raise ValueError(rule)


def study_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense causal attention of the window, or attention restricted to the rule's selected blocks."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    group = h // h_kv
    total = key.shape[2]
    prefix = total - q_len
    scale = scaling if scaling is not None else d**-0.5
    if prefix == 0:  # the prefill: plain causal attention (a 16K x 16K score matrix would not fit)
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            key.repeat_interleave(group, 1),
            value.repeat_interleave(group, 1),
            is_causal=True,
            scale=scale,
        )
        return out.transpose(1, 2), None
    causal = torch.ones(q_len, total, dtype=torch.bool).tril(diagonal=prefix)  # [q, L]
    allowed = causal[None, None].expand(b, h_kv, q_len, total).clone()
    cfg = Study.cfg
    if Study.rule != "dense" and q_len > 1 and prefix > cfg.dense_below:
        block = cfg.block_size
        n = -(-prefix // block)
        keep_tokens = int((prefix - cfg.dense_below) * cfg.rho + cfg.dense_below)
        budget = min(n, -(-keep_tokens // block))
        scores = _block_scores(Study.rule, query, key, prefix, block, scale)  # [B, H_kv, n]
        forced = torch.zeros(n, dtype=torch.bool)
        forced[0] = True  # sink
        forced[max(0, n - cfg.local_blocks) :] = True  # local blocks before the window
        scores = scores.masked_fill(forced, float("inf"))
        top = scores.topk(budget, dim=-1).indices  # [B, H_kv, budget]
        chosen = torch.zeros(b, h_kv, n, dtype=torch.bool).scatter_(2, top, True)
        token_ok = chosen.repeat_interleave(block, dim=2)[..., :prefix]  # [B, H_kv, prefix]
        allowed[..., :prefix] &= token_ok[:, :, None, :]
    logits = (
        torch.einsum("bkgqd,bkld->bkgql", query.float().view(b, h_kv, group, q_len, d), key.float()) * scale
    )
    logits = logits.masked_fill(~allowed[:, :, None], float("-inf"))
    out = torch.einsum("bkgql,bkld->bkgqd", logits.softmax(dim=-1), value.float())
    return out.reshape(b, h, q_len, d).transpose(1, 2).to(query.dtype), None


def _crop_to(cache: DynamicCache, length: int) -> None:
    if cache.get_seq_length() > length:
        cache.crop(length - cache.get_seq_length())  # a negative count removes that many tokens


@torch.no_grad()
def run_prompt(model, ids: torch.Tensor, new_tokens: int, k: int) -> dict:
    dense = model.generate(ids[None], max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    continuation = dense[0, ids.numel() :]
    Study.rule = "dense"
    cache = DynamicCache(config=model.config)
    model(ids[None], **{CACHE_KWARG: cache}, use_cache=True, logits_to_keep=1)
    per_rule = {
        r: dict(flips=0, flips_low_margin=0, abs_err_sum=0.0, abs_err_max=0.0, positions=0) for r in RULES
    }
    window = k + 1
    fed = torch.cat(
        [ids[-1:], continuation]
    )  # verify windows start at the last prompt token (its logits too)
    start = 0
    length = ids.numel() - 1
    _crop_to(cache, length)
    while start + window <= fed.numel():
        chunk = fed[start : start + window][None]
        outs = {}
        for rule in RULES:
            Study.rule = rule
            outs[rule] = model(chunk, **{CACHE_KWARG: cache}, use_cache=True).logits[0].float()
            _crop_to(cache, length)
        dense_logits = outs["dense"]
        top2 = dense_logits.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        for rule in RULES[1:]:
            err = (outs[rule] - dense_logits).abs()
            flips = outs[rule].argmax(-1) != dense_logits.argmax(-1)
            r = per_rule[rule]
            r["flips"] += int(flips.sum())
            r["flips_low_margin"] += int((flips & (margin < 0.25)).sum())
            r["abs_err_sum"] += float(err.max(dim=-1).values.sum())
            r["abs_err_max"] = max(r["abs_err_max"], float(err.max()))
            r["positions"] += window
        per_rule["dense"]["positions"] += window
        per_rule["dense"]["low_margin_positions"] = per_rule["dense"].get("low_margin_positions", 0) + int(
            (margin < 0.25).sum()
        )
        Study.rule = "dense"
        model(chunk, **{CACHE_KWARG: cache}, use_cache=True)  # advance over the window densely
        length += window
        start += window
    return per_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=os.environ.get("HF_SPARSE_VERIFY_SHARED", "../shared") + "/models"
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[16384])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=63)
    parser.add_argument("--k", type=int, default=6)
    parser.add_argument("--rho", type=float, default=SparseAttention().rho)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    Study.cfg = SparseAttention(rho=args.rho)
    AttentionInterface.register(NAME, study_attention)
    model, tokenizer = _load(os.path.join(args.models, "code-target"), "cpu", torch.float32)
    model.set_attn_implementation(NAME)
    records = []
    for context in args.contexts:
        keep = context - 256 - args.k - 1  # as bench_sparse_quality.py trims for 256 new tokens
        prompt_file = os.path.join(args.models, "prompts_long.jsonl" if context > 8192 else "prompts.jsonl")
        prompts = [ids[-keep:] for ids in _prompts(prompt_file, context, args.prompts, tokenizer)]
        totals: dict[str, dict] = {}
        for index, ids in enumerate(tqdm(prompts, desc=f"selection rules {context}", file=sys.stderr)):
            per_rule = run_prompt(model, ids, args.new_tokens, args.k)
            for rule, r in per_rule.items():
                records.append(dict(context=context, prompt=index, rule=rule, rho=args.rho, **r))
                t = totals.setdefault(rule, dict(flips=0, flips_low_margin=0, abs_err_sum=0.0, positions=0))
                for key in ("flips", "flips_low_margin", "abs_err_sum", "positions"):
                    t[key] += r.get(key, 0)
        for rule, t in totals.items():
            if rule != "dense":
                print(
                    f"{context} {rule:>13}: flips {t['flips']}/{t['positions']} (low-margin {t['flips_low_margin']}), "
                    f"mean max|dlogit| {t['abs_err_sum'] / max(t['positions'], 1):.4f}",
                    flush=True,
                )
    with open(args.out, "w") as f:
        json.dump(
            dict(machine=machine_info(torch.device("cpu")), method=__doc__.split("\n\n")[1], records=records),
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
