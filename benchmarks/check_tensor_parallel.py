"""Tensor parallelism through transformers (``tp_plan="auto"``), run under ``torchrun``: greedy output of
hf_sparse_verify equal to plain ``generate`` on the same sharded model, and (``--steps``) step times of our K = 0
step and a K = 4 verify step (5 tokens) next to plain transformers on the same shards.

A random model of a `hf_sparse_verify.drivers.shapes` preset is saved once (rank 0) to ``--checkpoint`` and loaded
sharded by every rank. Equality is checked in float32 (see the README); steps are timed in ``--dtype``. Our calls
run the model on its local shards with explicit collectives (`hf_sparse_verify.integrations.tensor_parallel`;
``local_shards`` in the record says whether they cover the model, or why not), so on GPUs our steps are CUDA graphs
with the NCCL collectives inside. Rank 0 writes the JSON.

    torchrun --nproc-per-node 2 benchmarks/check_tensor_parallel.py --shape llama-3.1-8b --layers 4  # record "<shape>_equality" of results/tensor_parallel.json
    torchrun --nproc-per-node 2 benchmarks/check_tensor_parallel.py --shape llama-3.1-8b --dtype bfloat16 \\
        --steps --no-equality --context 1024 --json step.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import hf_sparse_verify as hsv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from benchmarks.check_device_map import CASES, prompts
from hf_sparse_verify.drivers.machine import machine_info
from hf_sparse_verify.drivers.shapes import shape_config
from hf_sparse_verify.drivers.step_bench import StepBenchArgs, run_on
from hf_sparse_verify.integrations.tensor_parallel import local_shard_swaps
from hf_sparse_verify.placement import RankAgreement, tensor_parallel


def save_random(shape: str, layers: int | None, path: Path, dtype: torch.dtype, std: float, device) -> None:
    """Rank 0: a random model of preset ``shape`` saved to ``path``. The model is built on the meta device and each
    tensor drawn on ``device`` (a GPU draws billions in seconds); norms are ones, tied tensors drawn once. Llama
    shapes, whose checkpoint names are their parameter names, are written shard by shard as they are drawn, so the
    host holds one shard at a time (the 70B shape: 141 GB on disk, 4 GB in memory); other models (MoE experts,
    which transformers renames on saving) are held whole and saved by ``save_pretrained``."""
    config = shape_config(shape)
    if layers is not None:
        config.num_hidden_layers = layers
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    drawn: dict[int, torch.Tensor] = {}

    def draw(name: str, meta: torch.Tensor) -> torch.Tensor:
        t = torch.empty(meta.shape, dtype=meta.dtype, device=device)
        t.fill_(1.0) if "norm" in name else t.normal_(0.0, std, generator=gen)
        return t.cpu()

    if config.model_type != "llama":
        state = {}
        for name, meta in model.state_dict(keep_vars=True).items():
            if id(meta) not in drawn:
                drawn[id(meta)] = draw(name, meta)
            state[name] = drawn[id(meta)]
        model.save_pretrained(path, state_dict=state)
    else:
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(path)
        shard, shard_bytes, files, weight_map, total = {}, 0, [], {}, 0

        def flush() -> None:
            nonlocal shard, shard_bytes
            name = f"model-{len(files) + 1:05d}.safetensors"
            save_file(shard, path / name, metadata={"format": "pt"})
            files.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

        for name, meta in model.state_dict(keep_vars=True).items():
            if id(meta) in drawn:  # tied: saved once, tied again on loading
                continue
            drawn[id(meta)] = None
            shard[name] = draw(name, meta)
            shard_bytes += shard[name].nbytes
            total += shard[name].nbytes
            if shard_bytes >= 4 << 30:
                flush()
        if shard:
            flush()
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    del model, drawn
    if device.type == "cuda":
        torch.cuda.empty_cache()


def load_sharded(path: Path, dtype: torch.dtype):
    with warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # 5.23 prefers distributed_config; 5.17 has only tp_plan
        model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", dtype=dtype)
    return model.eval()


def local_shards(model) -> str:
    """What our calls run the model on: its local shards (the replacements by class), or why not."""
    swaps, reason = local_shard_swaps(model)
    if reason is not None:
        return f"transformers' tensor-parallel modules: {reason}"
    counts = Counter(type(new).__name__ for *_, new in swaps)
    return "local shards: " + ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def equality(model, new_tokens: int, device) -> list[dict]:
    config = model.config.get_text_config()
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    records = []
    for ids, mask in prompts(config.vocab_size, pad_id, device):
        common = dict(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
        )
        begin = time.perf_counter()
        plain = model.generate(**common)
        plain_s = time.perf_counter() - begin
        for strategy, settings in CASES:
            extra = {"draft_model": model} if strategy == "draft_model" else {}
            begin = time.perf_counter()
            out = model.generate(
                **common,
                custom_generate=hsv.generate,
                speculation=dict(strategy=strategy, num_draft_tokens=4, **settings),
                return_dict_in_generate=True,
                **extra,
            )
            seconds = time.perf_counter() - begin
            same = out.sequences.shape == plain.shape and torch.equal(out.sequences, plain)
            records.append(
                dict(
                    batch=ids.shape[0],
                    strategy=strategy + (", utility K policy" if settings else ""),
                    identical_to_plain=bool(same),
                    mean_acceptance_length=out.speculation.mean_acceptance_length,
                    steps=out.speculation.steps,
                    seconds=round(seconds, 3),
                    plain_seconds=round(plain_s, 3),
                )
            )
            if dist.get_rank() == 0:
                print(records[-1], flush=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers than the preset")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument(
        "--checkpoint", default=None, help="where the random model is saved (default: /tmp/...)"
    )
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--init-std", type=float, default=0.02, help="std of the random weights (not norms)")
    parser.add_argument("--no-equality", action="store_true")
    parser.add_argument("--steps", action="store_true", help="time K = 0 and K = 4 verify steps")
    parser.add_argument("--context", type=int, nargs="+", default=[1024])
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    _records.add_arguments(parser, "tensor_parallel")
    args = parser.parse_args()

    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    dtype = getattr(torch, args.dtype)
    checkpoint = Path(
        args.checkpoint or f"/tmp/hsv_tp_{args.shape}_{args.layers}_{args.dtype}_{args.init_std}"
    )
    begin = time.time()
    if dist.get_rank() == 0 and not (checkpoint / "config.json").exists():
        save_random(args.shape, args.layers, checkpoint, dtype, args.init_std, device)
    dist.barrier()
    model = load_sharded(checkpoint, dtype)
    if not tensor_parallel(model):
        raise SystemExit(
            "the model did not load tensor-parallel (no DTensor weights): run under torchrun with "
            "--nproc-per-node 2 or more (transformers does not shard over one rank)"
        )
    report = dict(
        machine=machine_info(device),
        ranks=dist.get_world_size(),
        shape=args.shape,
        layers=model.config.get_text_config().num_hidden_layers,
        dtype=args.dtype,
        load_s=round(time.time() - begin, 1),
        local_shards=local_shards(model),
        # every rank offers its rank + 1 as a step time: the agreed value is the largest, the world size
        agreed_seconds=RankAgreement(model).seconds(dist.get_rank() + 1.0)[0],
        # the same through the background exchange the loop uses (`RankAgreement.start`)
        agreed_in_background=RankAgreement(model).start(dist.get_rank() + 1.0).values()[0],
    )
    if not args.no_equality:
        report["equality"] = equality(model, args.new_tokens, device)
    if args.steps:
        step_args = StepBenchArgs(
            shape=args.shape,
            contexts=tuple(args.context),
            new_tokens=(1, 5),
            batches=tuple(args.batch),
            device=str(device),
            dtype=args.dtype,
        )
        torch.manual_seed(0)
        report["steps"] = run_on(model, step_args, device, ranks=dist.get_world_size())
    if dist.get_rank() == 0:
        setting = f"{args.shape}_{'steps' if args.steps else 'equality'}"
        _records.save(args, report, device, setting=setting)
        print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1)[:4000])
    del model
    hsv.clear_graph_cache()  # the captured graphs hold NCCL work: drop them before the process group goes
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
