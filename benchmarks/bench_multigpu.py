"""Several GPUs: a random bf16 model of a preset shape dispatched by accelerate over every visible GPU (the balanced
map ``device_map="auto"`` resolves to), our steps and whole ``generate`` calls against plain transformers under the
same map, next to our single-GPU step where the model fits one GPU.

Per (shape, batch, context) it measures:
- ``step_ms``: our K = 0 step (one token per row) under the device map, ``verify_ms``: our K = 4 verify (5 tokens
  per row), each the median of 10 calls after 3 warm-ups, host clock around a synchronized call, caches of random
  keys and values (`hf_sparse_verify.drivers.step_bench.our_step_ms`);
- ``single_gpu_step_ms`` / ``single_gpu_verify_ms``: the same K = 0 step and K = 4 verify with the whole model on
  GPU 0 (``--single-gpu``);
- ``floor_ms``: weight bytes one step reads plus the KV bytes, over one card's copy bandwidth (under a device map
  one device reads at a time);
- ``plain_ms``: plain ``generate``'s decode milliseconds per token under the same map (the second of two identical
  calls, minus a one-new-token call for the prefill, over the new tokens; the first call builds its cuDNN plans);
- per strategy (``k0``, ``prompt_lookup:4``, ``vegas:6``, ``auto``, the cases of ``bench_e2e.py``) one warm-up call
  (it captures the graphs) and one timed call on a prompt whose second half repeats its first:
  ``decode_tokens_per_s`` and ``vs_plain``.

With ``--path tensor_parallel`` (run under ``torchrun``, one process per GPU) the model is a random checkpoint of
the shape saved once by rank 0 and loaded sharded (``tp_plan="auto"``); our calls run it on its local shards with
NCCL collectives inside the step graphs (`hf_sparse_verify.integrations.tensor_parallel`), plain ``generate`` runs
transformers' DTensor modules; ``floor_ms`` is one rank's share of the bytes over one card's copy bandwidth (the
all-reduces not counted); rank 0 times the single-GPU step before the sharded model is loaded.

Writes ``benchmarks/results/multigpu.json`` (a ``records`` list, one record per (device kind, GPUs, path, shape,
batch, context, strategy)).

    python benchmarks/bench_multigpu.py --shape llama-3.1-8b --contexts 1024 --batches 1 --single-gpu
    torchrun --nproc-per-node 2 benchmarks/bench_multigpu.py --path tensor_parallel --single-gpu
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
import hf_sparse_verify as hsv
from benchmarks import _records
from benchmarks.bench_e2e import run_case
from benchmarks.check_device_map import dispatched_random_model
from benchmarks.check_tensor_parallel import load_sharded, save_random
from hf_sparse_verify.drivers.machine import copy_bandwidth, machine_info
from hf_sparse_verify.drivers.shapes import kv_bytes, random_model, shape_config, weight_bytes_per_step
from hf_sparse_verify.drivers.step_bench import our_step_ms

CASES = ("k0", "prompt_lookup:4", "vegas:6", "auto")


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _teardown(model) -> None:
    """Every rank: drop the captured graphs (they hold NCCL work) before the process group goes."""
    del model
    hsv.clear_graph_cache()
    _free()
    torch.cuda.synchronize()
    print(f"rank {dist.get_rank()}: teardown", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def prompt(vocab: int, batch: int, context: int, device="cuda:0", seed: int = 0) -> torch.Tensor:
    """``[B, context]`` random ids whose second half repeats the first (text worth looking up)."""
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(0, vocab, (batch, (context + 1) // 2), generator=gen)
    return torch.cat([half, half], dim=1)[:, :context].to(device)


def gpu_kind() -> str:
    name = torch.cuda.get_device_name(0)
    for kind in ("H200", "H100", "A100", "L40S"):
        if kind in name:
            return kind
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _records.add_arguments(parser, "multigpu")
    parser.add_argument("--shape", default="llama-3.1-8b", help="a preset of hf_sparse_verify.drivers.shapes")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--single-gpu", action="store_true", help="also time the K = 0 step on GPU 0 alone")
    parser.add_argument(
        "--layers", type=int, default=None, help="fewer decoder layers than the shape (smoke runs)"
    )
    parser.add_argument("--path", default="device_map", choices=("device_map", "tensor_parallel"))
    parser.add_argument("--checkpoint", default=None, help="tensor_parallel: where rank 0 saves the random model")
    args = parser.parse_args()
    tp = args.path == "tensor_parallel"
    if tp:
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        gpus = dist.get_world_size()
        if gpus < 2:
            raise SystemExit("--path tensor_parallel runs under torchrun --nproc-per-node 2 (or more)")
    else:
        local, gpus = 0, torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"bench_multigpu needs two or more GPUs; this machine has {gpus}")
    rank0 = local == 0
    device = f"cuda:{local}"
    dtype = torch.bfloat16
    config = shape_config(args.shape)
    if args.layers:
        config.num_hidden_layers = args.layers
    single: dict[tuple, float] = {}
    if args.single_gpu and rank0:
        if args.layers:
            with torch.device("cuda:0"):
                model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        else:
            model = random_model(args.shape, "cuda:0", dtype)
        for context in args.contexts:
            for batch in args.batches:
                times, mode = our_step_ms(model, context, batch, [1, 5], "cuda:0")
                single[(batch, context)] = times
                print(f"single GPU, batch {batch}, context {context}: K = 0 step {times[1]:.3f} ms, K = 4 verify "
                      f"{times[5]:.3f} ms ({mode})", flush=True)  # fmt: skip
        del model
        _free()

    start = time.time()
    if tp:
        checkpoint = Path(args.checkpoint or f"/tmp/hsv_tp_{args.shape}_{args.layers}")
        if rank0 and not (checkpoint / "config.json").exists():
            save_random(args.shape, args.layers, checkpoint, dtype, 0.02, torch.device(device))
        dist.barrier()
        model = load_sharded(checkpoint, dtype)
        devices = [str(d) for d in range(gpus)]
    else:
        model, device_map = dispatched_random_model(config, dtype)
        devices = sorted({str(v) for v in device_map.values()})
    build_s = time.time() - start
    bandwidth = copy_bandwidth(torch.device(device))
    records = []
    total = len(args.contexts) * len(args.batches) * (len(args.cases) + 2)
    with tqdm(total=total, desc=f"bench multigpu {args.shape}", file=sys.stderr, disable=not rank0) as bar:
        for context in args.contexts:
            for batch in args.batches:
                times, mode = our_step_ms(model, context, batch, [1, 5], device)
                _free()
                bar.update(1)
                if rank0:
                    print(f"{args.path}, batch {batch}, context {context}: K = 0 step {times[1]:.3f} ms, K = 4 "
                          f"verify {times[5]:.3f} ms ({mode})", flush=True)  # fmt: skip
                floor_ms = 1000 * (
                    weight_bytes_per_step(model, 1, batch) + kv_bytes(model, context, batch, dtype)
                )
                floor_ms /= bandwidth * (gpus if tp else 1)
                ids = prompt(config.vocab_size, batch, context, device=device)
                plain = run_case("transformers", model, None, ids, args.new_tokens, "cuda")
                bar.update(1)
                plain_ms = (
                    1000 / plain["decode_tokens_per_s"] * batch if plain["decode_tokens_per_s"] else None
                )
                common = dict(
                    device=gpu_kind(),
                    gpus=gpus,
                    path=args.path,
                    shape=args.shape + (f"-{args.layers}-layers" if args.layers else ""),
                    batch=batch,
                    context=context,
                    new_tokens=args.new_tokens,
                    step_ms=round(times[1], 4),
                    verify_ms=round(times[5], 4),
                    step_mode=mode,
                    floor_ms=round(floor_ms, 4),
                    step_over_floor=round(times[1] / floor_ms, 3),
                    plain_ms=round(plain_ms, 4) if plain_ms else None,
                    single_gpu_step_ms=round(single[(batch, context)][1], 4) if (batch, context) in single else None,
                    single_gpu_verify_ms=round(single[(batch, context)][5], 4) if (batch, context) in single else None,
                    devices_used=devices,
                    build_s=round(build_s, 1),
                )
                if common["single_gpu_step_ms"]:
                    common["step_vs_single_gpu"] = round(times[1] / common["single_gpu_step_ms"], 3)
                    common["verify_vs_single_gpu"] = round(times[5] / common["single_gpu_verify_ms"], 3)
                records.append(
                    dict(
                        common,
                        strategy="transformers",
                        decode_tokens_per_s=plain["decode_tokens_per_s"],
                        vs_plain=1.0,
                        capture_s=0.0,
                        mean_acceptance_length=1.0,
                    )  # fmt: skip
                )
                for case in args.cases:
                    try:
                        result = run_case(case, model, None, ids, args.new_tokens, "cuda")
                    except Exception as err:  # one failing case should not lose the others' records
                        records.append(dict(common, strategy=case, error=f"{type(err).__name__}: {err}"))
                        print(f"{case}: {records[-1]['error']}", flush=True)
                        continue
                    finally:
                        bar.update(1)
                    records.append(
                        dict(
                            common,
                            strategy=result["strategy"],
                            k_policy=result["k_policy"],
                            decode_tokens_per_s=round(result["decode_tokens_per_s"], 2),
                            vs_plain=round(result["decode_tokens_per_s"] / plain["decode_tokens_per_s"], 3),
                            capture_s=round(result["capture_s"], 4),
                            first_capture_s=round(result["first_capture_s"], 3),
                            mean_acceptance_length=result["mean_acceptance_length"],
                            steps=result["steps"],
                            verify_step_ms=round(result["verify_ms"], 4) if result["verify_ms"] else None,
                            **({"chosen": result["chosen"]} if "chosen" in result else {}),
                        )
                    )
                    if rank0:
                        print({k: records[-1][k] for k in ("strategy", "decode_tokens_per_s", "vs_plain",
                                                           "capture_s")}, flush=True)  # fmt: skip
    machine = machine_info(torch.device("cuda:0"))
    path = Path(args.json)
    if not args.no_save and rank0:
        data = _records.load(path) if path.exists() else {"benchmark": "multigpu", "records": []}
        data.setdefault("description", __doc__.split("\n\n")[0])
        # a record is replaced only by one of the same commit, so runs before and after a change sit side by side
        fields = ("device", "gpus", "path", "shape", "batch", "context", "strategy")
        keys = {tuple(r[f] for f in fields) + (machine.get("commit"),) for r in records}
        kept = [
            r for r in data.get("records", []) if tuple(r.get(f) for f in fields) + (r.get("commit"),) not in keys
        ]
        data["records"] = kept + [dict(r, machine=machine, commit=machine.get("commit")) for r in records]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    if rank0:
        print(json.dumps(records, indent=1), flush=True)
    if tp:
        _teardown(model)


if __name__ == "__main__":
    main()
