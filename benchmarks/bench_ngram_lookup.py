"""Prompt lookup's device search per decode step, as the kernel and as a decode step pays for it.

For 1 x 16K, 16 x 16K and 32 x 8K histories (``repeated``: each row a random 1500-token passage repeated, so every
n-gram recurs; ``random``: uniform tokens of a 32K vocabulary) and K = 4 and 16:

- ``graph_us``: the search alone, 20 calls captured in a CUDA graph, median replay time per call
  (`triton.testing.do_bench`): ``old`` (one program per row, `--old`), ``new`` (`NgramLookup`), and the new
  kernel at other block sizes (``block_<n>``);
- ``eager_us``: what the decode loop's timer sees of one call on an idle GPU: event record, the call, a new event
  recorded, synchronise, median of 200: ``old`` (the old ``ngram_lookup`` custom op, then ``counts * active``, as the
  drafter did), ``new`` (`NgramLookup` with ``active``), ``new_op`` (the ``ngram_lookup`` custom op, fresh outputs),
  ``graph_replay`` (a CUDA graph of one `NgramLookup` call, replayed: what capturing the search would leave);
- ``host_us``: host time per call, 500 calls back to back (the GPU runs behind);
- ``draft_us``: eager time of the draft part of a step on a real `DecodeState`: ``new``
  (`PromptLookupDrafter.get_candidates`), ``old`` (the old drafter's device path), ``empty`` (a K = 0 step's
  `empty_draft`).

Every case checks the new search's drafts and counts against the PyTorch reference (and the old kernel's).

``python benchmarks/bench_ngram_lookup.py [--old DIR] [--json PATH]``; ``--old`` names a folder holding the old
``ngram_lookup`` package (its ``op.py``, ``kernel.py``, ``naive.py``, with the custom op renamed) for the A/B.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from statistics import median

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `benchmarks` is a package
from benchmarks import _records
from hf_sparse_verify.generation.drafters.base import Draft, empty_draft
from hf_sparse_verify.generation.drafters.prompt_lookup import PromptLookupDrafter
from hf_sparse_verify.generation.engine.state import DecodeState
from hf_sparse_verify.kernels.ngram_lookup import NgramLookup, ngram_lookup, ngram_lookup_naive
from hf_sparse_verify.kernels.ngram_lookup.kernel import launch_ngram_lookup, new_scratch

SHAPES = ((1, 16384), (16, 16384), (32, 8192))
TEXTS = ("repeated", "random")
KS = (4, 16)
BLOCKS = (512, 1024, 2048)
MAX_N, MIN_N = 3, 1
VOCAB, PASSAGE, SPARE = 32000, 1500, 64


def histories(batch: int, context: int, text: str, device) -> DecodeState:
    gen = torch.Generator().manual_seed(batch * 7 + context)
    if text == "repeated":
        passage = torch.randint(3, VOCAB, (batch, PASSAGE), generator=gen)
        ids = passage.repeat(1, context // PASSAGE + 1)[:, :context]
    else:
        ids = torch.randint(3, VOCAB, (batch, context), generator=gen)
    return DecodeState.start(ids.to(device), [0] * batch, context + SPARE, 0, False, [])


def graph_us(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median") * 1000 / calls


def eager_us(fn, reps: int = 200) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return median(times)


def host_us(fn, reps: int = 500) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / reps * 1e6


def one_graph(fn):
    """``fn`` captured once; the replay as a callable."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def check(got, want, what: str) -> None:
    (got_d, got_c), (want_d, want_c) = got, want
    if not (torch.equal(got_c, want_c) and torch.equal(got_d, want_d)):
        raise AssertionError(f"{what}: drafts or counts differ from the reference")


def run_case(batch: int, context: int, text: str, k: int, old, device) -> dict:
    state = histories(batch, context, text, device)
    args = (state.tokens, state.committed_t, state.pad_t)
    active = state.active_t
    search = NgramLookup(batch, state.tokens.shape[1], k, MAX_N, MIN_N, device)
    search.check(*args, active)
    want = ngram_lookup_naive(*args, k, MAX_N, MIN_N, active)
    check(tuple(t.clone() for t in search(*args, active)), want, "new")
    found = int((want[1] > 0).sum())

    graph = {"new": graph_us(lambda: search(*args, active))}
    for block in BLOCKS:
        drafts, counts = torch.empty_like(search.drafts), torch.empty_like(search.counts)
        scratch = new_scratch(batch, MAX_N, MIN_N, device)

        def launch(block=block, drafts=drafts, counts=counts, scratch=scratch):
            launch_ngram_lookup(*args, active, drafts, counts, scratch, MAX_N, MIN_N, block=block)

        launch()
        check((drafts, counts), want, f"block {block}")
        graph[f"block_{block}"] = graph_us(launch)

    eager = {
        "new": eager_us(lambda: search(*args, active)),
        "new_op": eager_us(lambda: ngram_lookup(*args, k, MAX_N, MIN_N, active=active)),
        "graph_replay": eager_us(one_graph(lambda: search(*args, active))),
    }
    host = {"new": host_us(lambda: search(*args, active))}

    drafter = PromptLookupDrafter(MAX_N, MIN_N)
    draft = {
        "new": eager_us(lambda: drafter.get_candidates(state, k)),
        "empty": eager_us(lambda: empty_draft(batch, device)),
    }
    check(tuple(drafter.get_candidates(state, k)[:2]), want, "drafter")

    if old is not None:
        old_kernel, old_op = old

        def old_path():
            drafts, counts = old_op.ngram_lookup(*args, k, MAX_N, MIN_N)
            return drafts, counts * active

        def old_drafter():
            if drafter.searches_on_device(state):
                drafts, counts = old_op.ngram_lookup(*args, k, MAX_N, MIN_N, kernel=None)
                return Draft(drafts, counts * state.active_t, None, None)

        check(old_path(), want, "old")
        graph["old"] = graph_us(lambda: old_kernel.ngram_lookup_triton(*args, k, MAX_N, MIN_N))
        eager["old"] = eager_us(old_path)
        host["old"] = host_us(old_path)
        draft["old"] = eager_us(old_drafter)
    return dict(
        batch=batch,
        context=context,
        text=text,
        num_tokens=k,
        rows_found=found,
        graph_us=graph,
        eager_us=eager,
        host_us=host,
        draft_us=draft,
    )


def row_text(r: dict) -> str:
    def pair(d: dict) -> str:
        return f"{d.get('old', float('nan')):7.1f} {d['new']:7.1f}"

    blocks = " ".join(f"{r['graph_us'][f'block_{b}']:6.1f}" for b in BLOCKS)
    return (
        f"{r['batch']:>3} x {r['context']:<6} {r['text']:<9} K={r['num_tokens']:<3} found {r['rows_found']:>3} | "
        f"graph {pair(r['graph_us'])} [{blocks}] | eager {pair(r['eager_us'])} op {r['eager_us']['new_op']:6.1f} "
        f"replay {r['eager_us']['graph_replay']:6.1f} | host {pair(r['host_us'])} | "
        f"draft {pair(r['draft_us'])} empty {r['draft_us']['empty']:6.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="folder of the old ngram_lookup package, for the A/B")
    _records.add_arguments(parser, "ngram_lookup", default_setting="step_cost")
    args = parser.parse_args()
    device = torch.device("cuda")
    old = None
    if args.old:
        folder = Path(args.old).resolve()
        sys.path.insert(0, str(folder.parent))
        old = (
            importlib.import_module(f"{folder.name}.kernel"),
            importlib.import_module(f"{folder.name}.op"),
        )
    print(
        "us per call; columns: old new. graph [blocks "
        + " ".join(map(str, BLOCKS))
        + "] | eager (op: custom op, replay: one-call graph) | host | draft part of a step (empty: K = 0)"
    )
    results = []
    for batch, context in SHAPES:
        for text in TEXTS:
            for k in KS:
                results.append(run_case(batch, context, text, k, old, device))
                print(row_text(results[-1]), flush=True)
    record = {"setting": args.setting, "max_ngram": MAX_N, "min_ngram": MIN_N, "cases": results}
    if not args.no_save:
        path = _records.add(
            args.json, _records.stamp(record, device), "ngram_lookup", __doc__.split("\n\n")[0]
        )
        print(f"saved {path}")


if __name__ == "__main__":
    main()
