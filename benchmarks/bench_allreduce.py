"""The all-reduce a tensor-parallel decode step pays: two per decoder layer (after ``o_proj`` and ``down_proj``) of
``batch x hidden`` activations, a few KB each, inside a CUDA graph. Under ``torchrun`` (one process per GPU), for each
size, the microseconds per all-reduce of a graph of ``--chain`` back-to-back all-reduces (each reading the last's
result), replayed ``--repeats`` times:

- ``nccl``: ``torch.distributed.all_reduce`` (what `hf_sparse_verify.integrations.tensor_parallel` uses);
- ``symm_mem_one_shot``: the activations copied into a symmetric-memory buffer, then
  ``torch.ops.symm_mem.one_shot_all_reduce_out`` (every rank reads every rank's buffer over NVLink; no multicast).

and whether each gives every rank bitwise the same sums (a tensor-parallel model whose ranks disagree diverges), and
the same sums as NCCL, in float32 and bfloat16. Rank 0 writes ``--json`` (``records``: one per (method, dtype,
size)).

    torchrun --nproc-per-node 2 benchmarks/bench_allreduce.py --json allreduce.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from hf_sparse_verify.generation.engine.graphs import capture_graph


def _same_everywhere(x: torch.Tensor) -> bool:
    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, x)
    return all(torch.equal(p.view(torch.uint8), pieces[0].view(torch.uint8)) for p in pieces)


class _SymmMem:
    def __init__(self, numel: int, dtype, device):
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(group.group_name)
            except Exception:  # newer torch: not needed
                pass
        self.name = group.group_name
        self.buffer = symm_mem.empty(numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.name)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> None:
        buf = self.buffer[: x.numel()]
        buf.copy_(x.view(-1))
        torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", self.name, out.view(-1))


def measure(method: str, dtype, numel: int, chain: int, repeats: int, device) -> dict:
    rank = dist.get_rank()
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
    data = torch.randn(numel, generator=gen).to(device=device, dtype=dtype)
    record = dict(method=method, dtype=str(dtype).removeprefix("torch."), bytes=numel * data.element_size())
    try:
        x = data.clone()
        out = torch.empty_like(x)
        if method == "nccl":

            def one() -> None:
                out.copy_(x)
                dist.all_reduce(out)

        else:
            symm = _SymmMem(numel, dtype, device)

            def one() -> None:
                symm(x, out)

        # exactness: one all-reduce of the random data
        one()
        torch.cuda.synchronize()
        record["same_on_every_rank"] = _same_everywhere(out)
        reference = data.clone()
        dist.all_reduce(reference)
        record["same_as_nccl"] = bool(torch.equal(out, reference))
        record["max_abs_diff_to_nccl"] = float((out.float() - reference.float()).abs().max())

        def chained() -> None:
            for _ in range(chain):
                one()
                x.copy_(out)

        x.copy_(data / dist.get_world_size())
        graph, _ = capture_graph(chained, device)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        dist.barrier()
        begin = time.perf_counter()
        for _ in range(repeats):
            graph.replay()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - begin
        record["us_per_all_reduce"] = round(1e6 * seconds / (repeats * chain), 2)
    except Exception as err:  # a method that does not run here is a finding, not a crash
        record["error"] = f"{type(err).__name__}: {err}"[:500]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 16, 80])
    parser.add_argument("--chain", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local)
    warm = torch.ones(8, device=device)
    dist.all_reduce(warm)  # the communicator exists before any capture
    records = []
    for dtype in (torch.bfloat16, torch.float32):
        for rows in args.rows:
            for method in ("nccl", "symm_mem_one_shot"):
                record = measure(method, dtype, rows * args.hidden, args.chain, args.repeats, device)
                record.update(rows=rows, gpus=dist.get_world_size())
                records.append(record)
                if dist.get_rank() == 0:
                    print(record, flush=True)
    if dist.get_rank() == 0 and args.json:
        report = dict(
            benchmark="allreduce",
            gpu=torch.cuda.get_device_name(device),
            torch=torch.__version__,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            commit=os.environ.get("GIT_COMMIT"),
            records=records,
        )
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
