"""CUDA graphs for decode, verify and draft steps: one graph per width (new tokens per row), one shared memory
pool, static input buffers.

A captured step is the runner's ordinary forward with the ``"triton"`` attention backend, whose kernels read each
row's valid cache range from the device-side ``start``/``pad`` buffers; so a graph captured once replays correctly
at every later length, and changing K between steps only picks another graph. Replay copies the step's token ids
and start slots into the static buffers, replays, and returns the static logits buffer (valid until the next
replay of the same width).
"""

from __future__ import annotations

import time
import warnings

import torch

from ..attention import StepInfo

#: forwards run on a side stream before capturing a width (Triton compilation, cuBLAS workspaces)
WARMUP_FORWARDS = 2

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A warning shown once per process for ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class StepGraphs:
    """Captured steps of one `ModelRunner` for each width in ``widths``.

    Args:
        runner: the runner whose model, cache and padding the graphs use (its cache must be allocated: capture
            after the prefill).
        widths: new tokens per row to capture (for a target: 1 .. K_max + 1).
    """

    def __init__(self, runner, widths):
        self.runner = runner
        device = runner.device
        batch = runner.cache.batch_size
        self.start = torch.zeros(batch, dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        begin = time.perf_counter()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        # largest first: the pool is sized by the largest step and the smaller ones reuse it
        for width in sorted(set(widths), reverse=True):
            ids = torch.zeros(batch, width, dtype=torch.long, device=device)
            # warm-up writes land in the last cache slots, which every real step rewrites before reading
            self.start.fill_(runner.cache.capacity - width)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_FORWARDS):
                    self._step(ids)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                logits = self._step(ids)
            self.graphs[width] = (graph, ids, logits)
        torch.cuda.synchronize(device)
        self.capture_s = time.perf_counter() - begin

    @property
    def widths(self) -> set[int]:
        return set(self.graphs)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        """The forward that gets captured: everything derived from ``start`` is computed inside the graph."""
        runner = self.runner
        width = ids.shape[1]
        step = StepInfo(
            "verify",
            self.start,
            runner.pad_t,
            q_len=width,
            kv_len=runner.cache.capacity,
            backend=runner.backend,
        )
        return runner.run_model(ids, step)

    def replay(self, ids: torch.Tensor, start: list[int]) -> torch.Tensor:
        """Run the captured step of width ``ids.shape[1]``; returns the static ``[B, W, V]`` logits buffer."""
        graph, static_ids, logits = self.graphs[ids.shape[1]]
        static_ids.copy_(ids, non_blocking=True)
        self.start.copy_(torch.tensor(start, dtype=torch.long), non_blocking=True)
        graph.replay()
        return logits
