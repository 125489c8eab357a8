"""Which SDPA kernel should a later prefill chunk use? One chunk's attention (``q`` new tokens per row over ``L``
cached slots, causal aligned to the lower right), 8B heads (32 query, 8 KV heads of 128), bf16, timed with CUDA
events per SDPA backend: flash through ``causal_lower_right`` (the library's path), cuDNN and memory-efficient
attention with a boolean ``[1, 1, q, L]`` mask (KV heads in place with ``enable_gqa``, or repeated), and the square
plain-causal call of the first chunk per backend for scale. A backend that refuses a case is recorded as refused.

    python benchmarks/diag_prefill_attention.py --json benchmarks/results/h200_diag_prefill_attention.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from hf_sparse_verify.drivers.machine import machine_info

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}  # fmt: skip


def _time(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / repeats


def _cases(q, k, v, mask, chunk: int, kv: int) -> dict:
    """The SDPA calls to time, by name."""
    return {
        "lower_right_bias": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=causal_lower_right(chunk, kv), enable_gqa=True
        ),
        "bool_mask_gqa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        "bool_mask_repeated": lambda: F.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=mask
        ),
        "square_causal_gqa": lambda: F.scaled_dot_product_attention(
            q, k[:, :, :chunk], v[:, :, :chunk], is_causal=True, enable_gqa=True
        ),
    }


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--kv", nargs="+", type=int, default=[16384, 65536])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    heads, kv_heads, dim = 32, 8, 128
    records = []
    for kv in args.kv:
        q = torch.randn(args.batch, heads, args.chunk, dim, device=device, dtype=torch.bfloat16)
        k = torch.randn(args.batch, kv_heads, kv, dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        slots = torch.arange(kv, device=device)
        own = torch.arange(kv - args.chunk, kv, device=device)[:, None]
        mask = (slots <= own)[None, None]  # [1, 1, q, L]
        cases = _cases(q, k, v, mask, args.chunk, kv)
        reference = cases["lower_right_bias"]().float()
        for name, fn in cases.items():
            for backend, which in BACKENDS.items():
                record = dict(batch=args.batch, chunk=args.chunk, kv=kv, case=name, backend=backend)
                try:
                    with sdpa_kernel(which):
                        record["ms"] = _time(fn, args.repeats)
                        if name != "square_causal_gqa":
                            record["max_abs_diff"] = (fn().float() - reference).abs().max().item()
                except RuntimeError as err:
                    record["refused"] = str(err).split("\n")[0][:160]
                records.append(record)
                print(json.dumps(record), flush=True)
    with open(args.json, "w") as f:
        json.dump(dict(machine=machine_info(device), args=vars(args), records=records), f, indent=1)


if __name__ == "__main__":
    main()
