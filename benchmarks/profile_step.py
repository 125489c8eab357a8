"""Where the time of one captured decode or verify step goes: torch.profiler over replays of our graph step
(Llama-3.1-8B shape by default, random bf16 weights; MoE experts on the decoding implementation of
``switched.decoding_experts()`` of `speculation_mode`, as in ``bench step``), CUDA kernels grouped by name, and the step's kernel count.

``python benchmarks/profile_step.py --context 1024 --new-tokens 1``; ``--batch 4 --context
65536 --new-tokens 7 --vegas-scores`` profiles a Vegas verify step (Collect-2-Query softmax-weight scores);
``--draft-weights int4`` a full-KV draft step on a low-bit copy of the weights;
``--context 65536 --new-tokens 16 --sparse attn_reuse_ffn75`` a LOSSY sparse verify step of one of
`bench_sparse_verify`'s settings (set up as there). Run with ``HF_SPARSE_VERIFY_PDL=0`` to attribute time to kernels:
under PDL a kernel's span includes its wait for the kernel before it.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.drivers.profile import kernel_rows
from hf_sparse_verify.drivers.shapes import random_model
from hf_sparse_verify.drivers.step_bench import fill_random_kv
from hf_sparse_verify.generation.drafters.low_bit import low_bit_copy
from hf_sparse_verify.generation.engine.runner import ModelRunner
from hf_sparse_verify.integrations import Mode, speculation_mode
from hf_sparse_verify.step import Phase, ScoreCollection


def _sparse_state(name, model, runner, at, width, device):
    """The `SparseVerifyState` `bench_sparse_verify` times for setting ``name`` (FFN tau per shape, stand-in
    anchors), with its block summaries built from the cache."""
    from benchmarks.bench_sparse_verify import FFN_SHARE, SETTINGS, _anchors, _ffn_tau
    from hf_sparse_verify.sparse.config import LossySparseVerify, SparseFFN
    from hf_sparse_verify.sparse.state import SparseVerifyState

    cfg = SETTINGS[name]
    if name in FFN_SHARE:
        cfg = LossySparseVerify(
            attention=cfg.attention, ffn=SparseFFN(tau=_ffn_tau(model, FFN_SHARE[name], width))
        )
    layers = model.config.get_text_config().num_hidden_layers
    calibration = _anchors(layers) if cfg.attention is not None and cfg.attention.reuse else None
    state = SparseVerifyState(cfg, layers, calibration, runner.cache.layer_devices(device))
    state.prefill(runner.cache, runner.pad_t, at)
    return state


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vegas-scores", action="store_true", help="collect Vegas' two-row weight scores")
    parser.add_argument(
        "--sparse", help="a setting of benchmarks/bench_sparse_verify.py (LOSSY sparse verify)"
    )
    parser.add_argument(
        "--draft-weights", choices=("int8", "int4"),
        help="profile a full-KV draft step of a low-bit copy of the weights (the low_bit strategy's draft)",
    )  # fmt: skip
    parser.add_argument("--layout", default="auto", help="LowBitLinear layout of --draft-weights")
    parser.add_argument(
        "--no-stack", action="store_true", help="--draft-weights: q/k/v and gate/up kept apart"
    )
    parser.add_argument("--steps", type=int, default=10)
    _records.add_arguments(parser, "step_profile")
    args = parser.parse_args()
    device = torch.device("cuda")
    model = random_model(args.shape, device, torch.bfloat16)
    width = args.new_tokens
    copies = []  # a low-bit copy is made from the model as it is and switched with it, as `generate` does
    if args.draft_weights:
        copies.append(low_bit_copy(model, args.draft_weights, 128, args.layout, stack=not args.no_stack))
    with speculation_mode(model, *copies, mode=Mode(fused=True)) as switched, switched.decoding_experts():
        batch = args.batch
        runner = ModelRunner(model, batch, args.context + 16, device, "triton")
        zero = torch.zeros(batch, dtype=torch.long, device=device)
        at = torch.full((batch,), args.context, dtype=torch.long, device=device)
        runner.forward(torch.zeros(batch, 1, dtype=torch.long, device=device), zero, Phase.PREFILL, kv_len=1)
        fill_random_kv(runner.cache)
        phase = Phase.DRAFT if copies else Phase.VERIFY
        runner.draft_weights = copies[0] if copies else None
        scores = None
        if args.vegas_scores:
            scores = ScoreCollection("two_rows", weights=True)
            devices = runner.cache.layer_devices(device)
            scores.fix_buffers(
                {layer: ((batch, runner.cache.capacity), d) for layer, d in enumerate(devices)}
            )
        assert runner.capture([width], phase)
        if scores is not None:
            assert runner.capture([width], Phase.VERIFY, scores=scores)
        sparsity = _sparse_state(args.sparse, model, runner, at, width, device) if args.sparse else None
        if sparsity is not None:
            assert runner.capture([width], Phase.VERIFY, verify_sparsity=sparsity)
        ids = torch.randint(0, 1000, (batch, width), device=device)
        step = functools.partial(
            runner.forward, ids, at, phase, kv_len=args.context + width, scores=scores,
            verify_sparsity=sparsity,
        )  # fmt: skip
        for _ in range(3):
            step()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(args.steps):
            step()
        end.record()
        torch.cuda.synchronize()
        wall_ms = begin.elapsed_time(end) / args.steps  # back to back: kernels and the gaps between them
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
    rows = kernel_rows(prof, args.steps)
    total = sum(r["us_per_step"] for r in rows)
    count = sum(r["calls_per_step"] for r in rows)
    print(
        f"{args.shape} batch {args.batch} context {args.context} width {width} scores {args.vegas_scores} sparse {args.sparse} draft weights {args.draft_weights} {args.layout} stack {not args.no_stack}: {count:.0f} kernels, {total / 1000:.3f} ms GPU time, "
        f"{wall_ms:.3f} ms per step back to back"
    )
    for r in rows[:25]:
        print(f"{r['us_per_step']:9.1f} us  {r['calls_per_step']:6.1f}x  {r['kernel']}")
    if args.json:
        setting = f"{args.shape} {args.batch}x{args.context} new {args.new_tokens}"
        _records.save(
            args,
            dict(args=vars(args), kernels=count, gpu_ms=total / 1000, wall_ms=wall_ms, rows=rows),
            device,
            setting=setting,
        )


if __name__ == "__main__":
    main()
