"""Verify-step time, dense against LOSSY sparse verification, on random-weight model shapes (GPU).

For each shape, batch x context and setting: one `ModelRunner` on the triton backend with fused modules, a cache of
``context`` random keys/values per row, and the verify step of ``--new-tokens`` tokens captured as a CUDA graph twice:
dense (no slot) and with the setting's `SparseVerifyState` (block summaries built from the cache first). Both are
timed side by side in one process (median of ``--repeats`` synchronized calls after warm-ups); the plain decode step
(1 token, dense) is timed too, for the MoE target ("verify with expert skipping <= 1.3x our decode").

Writes the ``cases`` record of ``--json`` (default benchmarks/results/sparse_verify.json) with one record per case: shape, batch, context,
new_tokens, setting, dense_verify_ms, sparse_verify_ms, speedup, decode_ms, sparse_over_decode.

    python benchmarks/bench_sparse_verify.py --cases llama-3.1-8b:1x65536 llama-3.1-8b:8x32768 \
        --settings attn attn_exact attn_approx attn_ffn
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.machine import machine_info, median, time_calls
from hf_sparse_verify.drivers.shapes import random_model
from hf_sparse_verify.kernels.sparse_ffn.bench import tau_for
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE

ATTENTION = SparseAttention(block_size=64, rho=0.1, dense_below=4096)

#: name -> settings. FFN and MoE thresholds are fixed values here (random weights have no calibration); their quality
#: is measured on the trained fixtures by bench_sparse_quality.py
SETTINGS = {
    "attn": LossySparseVerify(attention=ATTENTION),  # the library's default rule (window-scored since 2026-12-07)
    # paper 000's first-token rule, the library default until 2026-12-07 (what the earlier `attn` records ran)
    "attn_shared": LossySparseVerify(attention=SparseAttention(schedule="shared")),
    "attn_reuse_shared": LossySparseVerify(attention=SparseAttention(schedule="shared", reuse=True)),
    "attn_exact": LossySparseVerify(attention=SparseAttention(schedule="exact_merged")),
    "attn_approx": LossySparseVerify(attention=SparseAttention(schedule="approx_shared", group_size=4)),
    "attn_reuse": LossySparseVerify(
        attention=SparseAttention(reuse=True)
    ),  # anchors: every 4th layer, see _anchors
    "attn_reuse_ffn": LossySparseVerify(attention=SparseAttention(reuse=True), ffn=SparseFFN(tau=0.0)),
    "attn_reuse_ffn75": LossySparseVerify(attention=SparseAttention(reuse=True), ffn=SparseFFN(tau=0.0)),
    "attn_ffn": LossySparseVerify(
        attention=ATTENTION, ffn=SparseFFN(tau=0.0)
    ),  # tau set per shape, see _ffn_tau
    "ffn": LossySparseVerify(attention=None, ffn=SparseFFN(tau=0.0)),
    "ffn75": LossySparseVerify(attention=None, ffn=SparseFFN(tau=0.0)),
    "moe_skip1": LossySparseVerify(attention=None, moe=SparseMoE(rule="budget", max_skip=1, budget=0.5)),
    "moe_skip2": LossySparseVerify(attention=None, moe=SparseMoE(rule="budget", max_skip=2, budget=0.5)),
    "moe_skip4": LossySparseVerify(attention=None, moe=SparseMoE(rule="budget", max_skip=4, budget=0.3)),
    "moe_skip6": LossySparseVerify(attention=None, moe=SparseMoE(rule="budget", max_skip=6, budget=0.1)),
    # row_union: the row's verify tokens share its `row_experts` heaviest experts (summed weight); min_keep = k - max_skip
    "moe_row8": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=8)),
    "moe_row16": LossySparseVerify(
        attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=16)
    ),
    "moe_row8_keep2": LossySparseVerify(
        attention=None, moe=SparseMoE(rule="row_union", max_skip=6, row_experts=8)
    ),
    # the shares of a row's experts graded on code-moe (row_experts 8 / 10 / 12 of the ~13 distinct experts 7 verify
    # tokens route to under a uniform router there), at the same share of the ~52 that 8 tokens reach here
    "moe_row24": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=24)),
    "moe_row28": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=28)),
    "moe_row32": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=32)),
    "moe_row36": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=36)),
    "moe_row40": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=40)),
    "moe_row44": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=44)),
    "moe_row48": LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=48)),
}


#: settings whose FFN tau is set per shape (`_ffn_tau`): the share of each verify row's channels they skip
FFN_SHARE = {"attn_ffn": 0.5, "attn_reuse_ffn": 0.5, "attn_reuse_ffn75": 0.75, "ffn": 0.5, "ffn75": 0.75}


def _ffn_tau(model, share: float, tokens: int) -> float:
    """A tau under which a share ``share`` of the row masks' channels fall on random inputs of the MLP's scale
    (unit RMS, what the post-attention norm hands it): the ``share`` quantile over channels of the maximum over a
    verify row's ``tokens`` tokens of ``|silu(gate(x))|`` in layer 0 (random weights: the same distribution in every
    layer). The row mask is what the kernels skip by, so a per-token quantile would skip far less: with 16 tokens a
    channel is skipped only when all 16 are under tau."""
    gate = model.model.layers[0].mlp.gate_proj.weight
    x = torch.randn(64, tokens, model.config.hidden_size, device=gate.device, dtype=gate.dtype)
    return float(tau_for(x, gate, share))


def _anchors(layers: int):
    """A stand-in calibration whose anchors are every 4th layer (random weights have nothing to calibrate; the
    anchor choice does not change the step's work, only which layers select)."""
    from hf_sparse_verify.sparse.calibration import SparseCalibration

    similarity = [0.0 if layer % 4 == 0 else 1.0 for layer in range(layers)]
    return SparseCalibration("random", layers, attention={"similarity": similarity})


def _contexts(model, device):
    from hf_sparse_verify.integrations import Mode, speculation_mode

    stack = contextlib.ExitStack()
    switched = stack.enter_context(speculation_mode(model, mode=Mode(fused=device.type == "cuda")))
    stack.enter_context(switched.decoding_experts())
    return stack


@torch.no_grad()
def run_case(shape: str, batch: int, context: int, width: int, settings: list[str], args, bar) -> list[dict]:
    from hf_sparse_verify.generation.engine.runner import ModelRunner
    from hf_sparse_verify.sparse.state import SparseVerifyState
    from hf_sparse_verify.step import Phase

    device = torch.device(args.device)
    model = (
        args.make_model(shape, device)
        if hasattr(args, "make_model")
        else random_model(shape, device, torch.bfloat16)
    )
    layers = model.config.get_text_config().num_hidden_layers
    vocab = model.config.get_text_config().vocab_size
    records = []
    with _contexts(model, device):
        runner = ModelRunner(
            model, batch, context + width, device, "triton" if device.type == "cuda" else "reference"
        )
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        runner.forward(torch.zeros(batch, 1, dtype=torch.long, device=device), zeros, Phase.PREFILL, kv_len=1)
        for layer in runner.cache.layers:
            layer.keys.normal_()
            layer.values.normal_()
        start = torch.full((batch,), context, dtype=torch.long, device=device)
        ids = torch.randint(0, vocab, (batch, width), device=device)
        runner.capture([1, width])
        timed = functools.partial(time_calls, device=device, warmups=args.warmups, repeats=args.repeats)
        decode = 1000 * median(
            timed(functools.partial(runner.forward, ids[:, :1], start, Phase.VERIFY, kv_len=context + 1))
        )
        dense = 1000 * median(
            timed(functools.partial(runner.forward, ids, start, Phase.VERIFY, kv_len=context + width))
        )
        bar.update(1)
        for name in settings:
            cfg = SETTINGS[name]
            share = FFN_SHARE.get(name)
            if share is not None:
                cfg = LossySparseVerify(
                    attention=cfg.attention, ffn=SparseFFN(tau=_ffn_tau(model, share, width))
                )
            calibration = _anchors(layers) if cfg.attention is not None and cfg.attention.reuse else None
            if cfg.moe is not None and not hasattr(model.config, "num_experts_per_tok"):
                continue
            devices = runner.cache.layer_devices(device)
            state = SparseVerifyState(cfg, layers, calibration, devices)
            state.prefill(runner.cache, runner.pad_t, start)
            runner.capture([width], Phase.VERIFY, verify_sparsity=state)
            call = functools.partial(
                runner.forward, ids, start, Phase.VERIFY, kv_len=context + width, verify_sparsity=state
            )
            sparse = 1000 * median(timed(call))
            records.append(
                dict(
                    shape=shape,
                    batch=batch,
                    context=context,
                    new_tokens=width,
                    setting=name,
                    setting_detail=cfg.to_dict(),
                    ffn_row_share_skipped=share,
                    dense_verify_ms=round(dense, 4),
                    sparse_verify_ms=round(sparse, 4),
                    speedup=round(dense / sparse, 3),
                    decode_ms=round(decode, 4),
                    dense_over_decode=round(dense / decode, 3),
                    sparse_over_decode=round(sparse / decode, 3),
                )  # fmt: skip
            )
            print(json.dumps(records[-1]), flush=True)
            bar.update(1)
    del runner, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cases", nargs="+", required=True, help="shape:BATCHxCONTEXT, e.g. llama-3.1-8b:1x65536"
    )
    parser.add_argument("--settings", nargs="+", default=["attn"], choices=sorted(SETTINGS))
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmups", type=int, default=3)
    _records.add_arguments(parser, "sparse_verify")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    records = []
    cases = []
    for case in args.cases:
        shape, sizes = case.split(":")
        batch, context = (int(v) for v in sizes.lower().split("x"))
        cases.append((shape, batch, context))
    with tqdm(total=len(cases) * (1 + len(args.settings)), desc="sparse verify", file=sys.stderr) as bar:
        for shape, batch, context in cases:
            records += run_case(shape, batch, context, args.new_tokens, args.settings, args, bar)
    result = dict(
        machine=machine_info(torch.device(args.device)),
        method=f"median of {args.repeats} synchronized calls after {args.warmups} warm-ups of the captured verify "
        "step (CUDA graph), dense and sparse side by side in one process; bf16 random weights, random KV cache",
        records=records,
    )
    _records.save(args, result, args.device, setting="cases")


if __name__ == "__main__":
    main()
