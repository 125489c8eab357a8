"""CUDA-graph timing shared by the benchmarks: `graph_us`, the median microseconds of one call from replays of a
graph of several calls, optionally cycling through copies of what the call reads (so that they do not sit in L2)."""

from __future__ import annotations

import torch

from hf_sparse_verify.generation.engine.graphs import capture_graph


def cycle_order(copies: int, inner: int) -> list[int]:
    """The copy each call of one captured graph reads: ``i % copies`` for the first multiple of ``copies`` calls that
    is at least ``inner``, so every replay reads every copy equally often and starts again at copy 0."""
    calls = -(-inner // copies) * copies
    return [i % copies for i in range(calls)]


def graph_us(fn, repeats: int = 50, inner: int = 20, copies: list[tuple] | None = None) -> float:
    """Median microseconds of one ``fn(*copies[i])`` from replays of a CUDA graph of `cycle_order`'s calls (``inner``
    calls of ``fn()`` when ``copies`` is None)."""
    copies = copies or [()]
    order = cycle_order(len(copies), inner)

    def calls() -> None:
        for i in order:
            fn(*copies[i])

    graph, _ = capture_graph(calls, torch.device("cuda", torch.cuda.current_device()))
    times = []
    for _ in range(repeats):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / len(order))
    times.sort()
    return times[len(times) // 2]
