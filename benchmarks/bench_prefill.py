"""Prefill time of long prompts: our engine's chunked prefill against plain transformers' one-forward prefill, on
the Llama-3.1-8B shape (random bf16 weights).

Our engine prefills ``PREFILL_TOKENS`` (rows x tokens) per forward. Every chunk after the first attends to all
slots before it: a causal mask aligned to the lower right. Half-precision chunks run it as SDPA flash attention
with grouped KV heads read in place (`DeviceView.is_chunk_causal`); ``--variants mask`` times the previous path
beside it (a boolean ``[B, 1, q, L]`` mask with the KV heads repeated to the query heads, which SDPA runs as
memory-efficient attention), by switching `is_chunk_causal` off in this process. ``--padded`` left-pads the rows
(row ``b`` by ``b / (2 B)`` of the context), which our engine attends to one row at a time over each row's real slots
(`attention.eager._padded_chunk_attention`; switched off as well for ``mask``) and plain transformers with its
4D mask.

- ``ours``: ``prefill_time_s`` of a ``generate`` call (K = 0, 1 new token; CUDA events around the prefill);
- ``plain``: ``model(input_ids, use_cache=True, logits_to_keep=1)`` with SDPA and a DynamicCache, host clock around
  a synchronized call; a 1 x 1024 warm-up call first (cuDNN plans are per shape; the timed shape is new to both,
  and SDPA's flash kernel, which plain causal prompts take, builds no plan).

Each variant runs ``--repeats`` times per case (median). Greedy tokens of a few new tokens are compared between
the variants (bf16: the two attention kernels round differently, so a mismatch is reported, not asserted).

    python benchmarks/bench_prefill.py --cases 4x65536 16x16384 1x65536
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

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.attention import eager as reference
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.shapes import random_model
from hf_sparse_verify.step.context import DeviceView

SHAPE = "llama-3.1-8b"


def _ours(model, ids, mask, new_tokens: int):
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        custom_generate=hsv.generate,
        speculation=dict(strategy="prompt_lookup", k_policy="plain"),
        return_dict_in_generate=True,
    )
    return out.speculation.prefill_time_s, out.sequences[:, ids.shape[1] :]


@torch.no_grad()
def _plain(model, ids, mask) -> float:
    torch.cuda.synchronize()
    begin = time.perf_counter()
    model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    return time.perf_counter() - begin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["4x65536", "16x16384", "1x65536"])
    parser.add_argument("--variants", nargs="+", default=["ours", "mask", "plain"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=4)
    parser.add_argument(
        "--padded", action="store_true", help="left-pad row b by b / (2 batch) of the context"
    )
    _records.add_arguments(parser, "prefill")
    args = parser.parse_args()
    device = torch.device("cuda")
    model = random_model(SHAPE, device, torch.bfloat16)
    vocab = model.config.vocab_size
    chunk_causal, padded_chunk = DeviceView.is_chunk_causal, reference._is_padded_chunk
    warm = torch.randint(0, vocab, (1, 1024), device=device)
    _plain(model, warm, torch.ones_like(warm))
    _ours(model, warm, torch.ones_like(warm), 2)
    records = []
    bar = tqdm(
        total=len(args.cases) * len(args.variants) * args.repeats, desc="bench_prefill", file=sys.stdout
    )
    for case in args.cases:
        batch, context = (int(x) for x in case.lower().split("x"))
        ids = torch.randint(
            0, vocab, (batch, context), device=device, generator=torch.Generator(device).manual_seed(0)
        )
        mask = torch.ones_like(ids)
        for row in range(batch):  # --padded: row b left-padded by b / (2 B) of the context
            mask[row, : row * context // (2 * batch) if args.padded else 0] = 0
        tokens = {}
        for variant in args.variants:
            previous = variant == "mask"
            DeviceView.is_chunk_causal = (lambda self, window: False) if previous else chunk_causal
            reference._is_padded_chunk = (lambda view, window: False) if previous else padded_chunk
            times = []
            for _ in range(args.repeats):
                if variant == "plain":
                    times.append(_plain(model, ids, mask))
                else:
                    seconds, tokens[variant] = _ours(model, ids, mask, args.new_tokens)
                    times.append(seconds)
                hsv.clear_graph_cache()
                torch.cuda.empty_cache()
                bar.update(1)
            record = dict(
                shape=SHAPE, batch=batch, context=context, padded=args.padded, variant=variant, prefill_s=statistics.median(times),
                runs_s=times, prompt_tokens_per_s=int(mask.sum()) / statistics.median(times),
            )  # fmt: skip
            records.append(record)
            print(json.dumps(record), flush=True)
        DeviceView.is_chunk_causal, reference._is_padded_chunk = chunk_causal, padded_chunk
        if "ours" in tokens and "mask" in tokens:
            same = (tokens["ours"] == tokens["mask"]).all(dim=1)
            records.append(dict(batch=batch, context=context, rows_same_tokens=int(same.sum()), rows=batch))
            print(json.dumps(records[-1]), flush=True)
        _records.save(
            args,
            dict(machine=machine_info(device), args=vars(args), records=records),
            device,
            setting="padded" if args.padded else "equal_rows",
        )
    bar.close()


if __name__ == "__main__":
    main()
