"""DSA verify on one DeepSeek-V3.2-shaped attention layer (random bf16 weights): the merged schedule's reads and
time against the same tokens as one-token decode steps, and against transformers' own attention path.

Per (batch, context): the layer's real dimensions (``DeepseekV32Config()`` defaults: 128 heads, latent 512 + rotary
64, indexer 64 heads x 128, top-k 2048); a context of random hidden states goes through the layer's projections
into a latent cache and an indexer key cache; ``--new-tokens`` random tokens then get their top-k from the layer's
own indexer. Recorded:

- ``union_over_topk``: the merged schedule's union of the step's selections over one token's top-k (the rows a
  verify of all new tokens reads, over the rows one decode step reads). **Random weights select nearly independent
  sets per token** (a trained indexer's consecutive selections overlap more), so this is a pessimistic figure.
- ``verify_us`` (one `hsv::sparse_mla` call over all new tokens, the default per-query schedule: each query over its
  own top-k in one launch) and ``verify_merged_us`` (the merged schedule: the union once, selection merging
  included) against ``decode_steps_us`` (one call per token, each over its own prefix), medians of CUDA-graph
  replays;
- ``kernel_verify_us`` / ``kernel_decode_us``: the merged kernel alone (selection precomputed) / the one-query calls'
  kernels alone;
- ``transformers_decode_us``: what transformers does for one decode token: ``kv_b_proj`` over every cached latent,
  then attention over the whole expanded cache with the top-k mask (SDPA).
- ``indexer_transformers_us`` / ``indexer_us``: the top-k of all new tokens by transformers' indexer module / by
  `SparseMLAAttention`'s (`hsv::index_scores`), and ``indexer_same_topk``, the share of queries whose sets agree.

    python benchmarks/bench_dsa.py --contexts 16384 32768 --batch 1 4 --new-tokens 8
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records  # noqa: E402
from benchmarks._timing import graph_us  # noqa: E402
from hf_sparse_verify.integrations.mla import SparseMLAAttention  # noqa: E402
from hf_sparse_verify.kernels.sparse_mla import (  # noqa: E402
    kernel,
    merged_selection,
    per_query_selection,
    sparse_mla,
)
from hf_sparse_verify.kernels.sparse_mla.kernel import sparse_mla_triton  # noqa: E402


class _IndexerKeys:
    """The one thing the indexer asks of a cache: its key rows, the new ones written after the ``context`` cached
    ones in place (as a static cache layer does), the whole buffer returned."""

    def __init__(self, keys: torch.Tensor, context: int):
        self.keys, self.context = keys, context

    def update_indexer(self, new: torch.Tensor, layer_idx: int) -> torch.Tensor:
        self.keys[:, self.context : self.context + new.shape[1]] = new
        return self.keys


def layer_inputs(attn, rotary, batch: int, context: int, new: int, device) -> dict:
    """Latent and indexer caches of ``context`` random tokens, and the ``new`` tokens' queries and top-k."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        apply_rotary_pos_emb,
        apply_rotary_pos_emb_interleave,
    )

    gen = torch.Generator(device=device).manual_seed(0)
    hidden = attn.config.hidden_size
    total = context + new
    latent = torch.empty(batch, total, attn.kv_lora_rank, device=device, dtype=torch.bfloat16)
    rot = torch.empty(batch, total, attn.qk_rope_head_dim, device=device, dtype=torch.bfloat16)
    index_keys = torch.empty(batch, total, attn.indexer.head_dim, device=device, dtype=torch.bfloat16)
    positions = torch.arange(total, device=device)[None].expand(batch, -1)
    cos, sin = rotary(latent, positions)
    chunk = 2048
    for lo in range(0, total, chunk):
        hi = min(lo + chunk, total)
        h = torch.randn(batch, hi - lo, hidden, device=device, dtype=torch.bfloat16, generator=gen)
        kv_pass, k_rot = torch.split(
            attn.kv_a_proj_with_mqa(h), [attn.kv_lora_rank, attn.qk_rope_head_dim], -1
        )
        latent[:, lo:hi] = attn.kv_a_layernorm(kv_pass)
        k_rot = k_rot[:, None]
        _, k_rot = apply_rotary_pos_emb_interleave(k_rot, k_rot, cos[:, lo:hi], sin[:, lo:hi])
        rot[:, lo:hi] = k_rot[:, 0]
        if lo < context:
            idx = attn.indexer
            k = idx.k_norm(idx.wk(h[:, : context - lo])).unsqueeze(2)
            k_r, k_p = torch.split(k, [idx.qk_rope_head_dim, idx.head_dim - idx.qk_rope_head_dim], -1)
            k_r, _ = apply_rotary_pos_emb(
                k_r, k_r, cos[:, lo : min(hi, context)], sin[:, lo : min(hi, context)], 2
            )
            index_keys[:, lo : min(hi, context)] = torch.cat([k_r, k_p], -1)[:, :, 0]
        last = h
    h_new = last[:, -new:]
    q_resid = attn.q_a_layernorm(attn.q_a_proj(h_new))
    slot = torch.arange(total, device=device)
    allowed = (slot[None, None, :] <= (context + torch.arange(new, device=device))[None, :, None]).expand(
        batch, new, total
    )
    new_cos, new_sin = cos[:, context:], sin[:, context:]
    index_cache = _IndexerKeys(index_keys, context)
    indices = attn.indexer(h_new, q_resid, (new_cos, new_sin), allowed.contiguous(), None, cache=index_cache)
    query = attn.q_b_proj(q_resid).view(batch, new, attn.num_heads, attn.qk_head_dim).transpose(1, 2)
    q_nope, q_rot = torch.split(query, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], -1)
    q_rot, _ = apply_rotary_pos_emb_interleave(q_rot, q_rot, new_cos, new_sin)
    weight = attn.kv_b_proj.weight.view(attn.num_heads, -1, attn.kv_lora_rank)
    q_lat = torch.einsum("bhqn,hnr->bqhr", q_nope, weight[:, : attn.qk_nope_head_dim]).contiguous()
    return dict(
        q_lat=q_lat, q_rot=q_rot.transpose(1, 2).contiguous(), q_nope=q_nope, q_rot_bhqp=q_rot, latent=latent,
        rot=rot, indices=indices, allowed=allowed.contiguous(), scaling=attn.scaling,
        indexer_args=(h_new, q_resid, new_cos, new_sin, allowed.contiguous(), index_cache),
    )  # fmt: skip


def transformers_decode(attn, x: dict, step: int):
    """transformers' path for new token ``step``: every cached latent through ``kv_b_proj``, then SDPA over the
    expanded cache with the top-k mask."""
    length = x["allowed"].shape[-1] - x["q_lat"].shape[1] + step + 1
    latent, rot = x["latent"][:, None, :length], x["rot"][:, None, :length]
    chosen = torch.zeros(x["allowed"].shape[0], 1, 1, length, dtype=torch.bool, device=latent.device)
    chosen.scatter_(-1, x["indices"][:, step, None, None].long().clamp_max(length - 1), True)
    query = torch.cat([x["q_nope"][:, :, step : step + 1], x["q_rot_bhqp"][:, :, step : step + 1]], -1)

    def run():
        key, value = attn.expand_kv(latent, rot)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=chosen, scale=x["scaling"])

    return run


def indexer_step(attn, x: dict) -> dict:
    """The step's top-k for all new tokens: transformers' indexer module (float32 copies of every key, ``[B, q, 64,
    L]`` per-head scores) against `SparseMLAAttention`'s (`hsv::index_scores`), both from the same projections and
    key cache; and how many queries' top-k sets agree (the same sums in another order may swap near-ties)."""
    hidden, q_resid, cos, sin, allowed, cache = x["indexer_args"]
    ours = SparseMLAAttention(attn)

    def theirs_call():
        return attn.indexer(hidden, q_resid, (cos, sin), allowed, None, cache=cache)

    def ours_call():
        return ours._select(hidden, q_resid, cos, sin, allowed, cache)

    same = (theirs_call().sort(-1).values == ours_call().sort(-1).values).all(-1)
    return dict(
        indexer_transformers_us=round(graph_us(theirs_call, repeats=10), 1),
        indexer_us=round(graph_us(ours_call), 1),
        indexer_same_topk=round(same.float().mean().item(), 4),
    )


def measure(attn, rotary, batch: int, context: int, new: int, device, sweep: bool = False) -> dict:
    x = layer_inputs(attn, rotary, batch, context, new, device)
    top_k = x["indices"].shape[-1]
    slots, bits, count = merged_selection(x["indices"], x["allowed"])
    args = [x[k] for k in ("q_lat", "q_rot", "latent", "rot")]

    def verify():
        sparse_mla(*args, x["indices"], x["allowed"], x["scaling"])

    def verify_merged():
        sparse_mla(*args, x["indices"], x["allowed"], x["scaling"], schedule="merged")

    def one(i):
        length = context + i + 1
        return (x["q_lat"][:, i : i + 1], x["q_rot"][:, i : i + 1], x["latent"], x["rot"],
                x["indices"][:, i : i + 1], x["allowed"][:, i : i + 1, :length])  # fmt: skip

    singles = [one(i) for i in range(new)]
    merged_singles = [per_query_selection(s[4], s[5]) for s in singles]

    def decode_steps():
        for s in singles:
            sparse_mla(*s, x["scaling"])

    def kernel_verify():
        sparse_mla_triton(*args, slots, bits, count, x["scaling"])

    def kernel_decode():
        for s, m in zip(singles, merged_singles):
            sparse_mla_triton(*s[:4], *m, x["scaling"])

    record = dict(
        batch=batch, context=context, new_tokens=new, top_k=top_k, heads=attn.num_heads,
        latent_dim=attn.kv_lora_rank, rope_dim=attn.qk_rope_head_dim, selection="indexer, random weights",
        union_mean=round(count.float().mean().item(), 1),
        union_over_topk=round(count.float().mean().item() / top_k, 3),
        decode_step_bytes=batch * top_k * (attn.kv_lora_rank + attn.qk_rope_head_dim) * 2,
        verify_union_bytes=int(count.sum().item()) * (attn.kv_lora_rank + attn.qk_rope_head_dim) * 2,
        verify_us=round(graph_us(verify), 1),
        verify_merged_us=round(graph_us(verify_merged), 1),
        decode_steps_us=round(graph_us(decode_steps), 1),
        kernel_verify_us=round(graph_us(kernel_verify), 1),
        kernel_decode_us=round(graph_us(kernel_decode), 1),
    )  # fmt: skip
    try:
        record["transformers_decode_us"] = round(
            graph_us(transformers_decode(attn, x, 0), repeats=10, inner=2), 1
        )
    except torch.OutOfMemoryError as err:
        record["transformers_decode_us"] = f"OOM: {str(err)[:120]}"
    record["verify_over_decode_steps"] = round(record["verify_us"] / record["decode_steps_us"], 3)
    record.update(indexer_step(attn, x))
    if sweep:
        record["sweep"] = []
        default = dict(kernel.TILES)
        for rows, block_n, warps in itertools.product((16, 32, 64), (16, 32, 64), (4, 8)):
            kernel.TILES.update(rows=rows, block_n=block_n, num_warps=warps)
            try:
                record["sweep"].append(dict(rows=rows, block_n=block_n, num_warps=warps,
                                            kernel_verify_us=round(graph_us(kernel_verify), 1),
                                            kernel_decode_us=round(graph_us(kernel_decode), 1)))  # fmt: skip
            except Exception as err:  # noqa: BLE001 - a setting that does not compile or fit: recorded
                record["sweep"].append(
                    dict(rows=rows, block_n=block_n, num_warps=warps, error=str(err)[:200])
                )
            finally:
                kernel.TILES.update(default)
    # the check the timing rests on: the merged kernel equals per-token decode on the same selections
    merged_out = sparse_mla(*args, x["indices"], x["allowed"], x["scaling"])
    single_out = torch.cat([sparse_mla(*s, x["scaling"]) for s in singles], dim=1)
    record["max_abs_diff_vs_decode"] = float((merged_out.float() - single_out.float()).abs().max())
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument(
        "--sweep", action="store_true", help="also time the kernel over a grid of launch settings"
    )
    _records.add_arguments(parser, "dsa", default_setting="deepseek-v3.2-layer")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_dsa times CUDA kernels: run it on a GPU")
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
        DeepseekV32Attention,
        DeepseekV32RotaryEmbedding,
    )

    device = torch.device("cuda")
    config = DeepseekV32Config()
    torch.manual_seed(0)
    with torch.device(device):
        attn = DeepseekV32Attention(config, layer_idx=0).to(torch.bfloat16).eval()
        rotary = DeepseekV32RotaryEmbedding(config)
    records = []
    with torch.no_grad():
        for batch in args.batch:
            for context in tqdm(args.contexts, desc=f"DSA layer, batch {batch}"):
                records.append(measure(attn, rotary, batch, context, args.new_tokens, device, args.sweep))
                print({k: v for k, v in records[-1].items() if k != "sweep"}, flush=True)
                for entry in sorted(
                    records[-1].get("sweep", []), key=lambda e: e.get("kernel_verify_us", 1e9)
                )[:5]:
                    print("  sweep", entry)
                torch.cuda.empty_cache()
    _records.save(args, dict(records=records, shape="deepseek-v3.2 attention layer (DeepseekV32Config defaults)"),
                  device)  # fmt: skip


if __name__ == "__main__":
    main()
