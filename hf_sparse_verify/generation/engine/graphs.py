"""CUDA graphs for decode, verify and draft steps (one graph per phase, width and step slots, one shared memory
pool, static input buffers), and for device-side updates between steps (`CapturedCall`).

A captured step is the runner's ordinary forward with the ``"triton"`` attention backend, whose kernels read each
row's valid cache range from the runner's fixed ``start``/``pad`` buffers and (for sparse drafting) the selection
from the `KVSelection`'s fixed buffers; so a graph captured once replays correctly at every later length, and
changing K between steps only picks another graph. Replay copies the step's token ids and start slots into the
static buffers (device to device: no synchronisation), replays, and returns the static logits buffer (valid until
the next replay of the same graph). Graphs live as long as their runner, which the session cache
(`sessions.SessionCache`) keeps across ``generate`` calls.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...step import Phase, StepContext

#: forwards run on a side stream before capturing a graph (Triton compilation, cuBLAS workspaces)
WARMUP_FORWARDS = 2


def capture_graph(
    fn: Callable[[], object], device: torch.device, pool=None
) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm ``fn`` up on a side stream of ``device``, then capture it there (into memory ``pool``, a new one when
    None); returns the graph and what the captured call returned. Replay it with ``device`` current (a graph
    launches on the current device's stream)."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_FORWARDS):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # no garbage collection inside the capture: a collected object's CUDA destructor (an event, say) is an
        # illegal call during capture whose error is swallowed, and the capture then fails at the next launch
        gc.disable()
        try:
            # a capture stream of this device (torch.cuda.graph's default one is made once, on whichever device
            # was current at its first use)
            with torch.cuda.graph(
                graph,
                pool=pool if pool is not None else torch.cuda.graph_pool_handle(),
                stream=torch.cuda.Stream(device),
            ):
                result = fn()
        except Exception:
            release_generator(device)
            raise
        finally:
            gc.enable()
    gc.collect()  # now, rather than in the middle of a later call's steps
    return graph, result


def release_generator(device: torch.device) -> None:
    """After a capture on ``device`` failed: take its CUDA random generator out of capture mode.

    PyTorch's ``CUDAGraph.capture_end`` raises (an invalidated capture) before it ends its generators' capture, and
    every later random op on that GPU then fails with "Offset increment outside graph capture encountered
    unexpectedly", so an eager fallback that samples would crash. A trivial capture on the device runs the
    generator's capture prologue and epilogue again. Errors here are left to the caller's own."""
    try:
        with torch.cuda.device(device):
            scratch = torch.zeros(1, device=device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
                scratch.add_(1)
            del graph
    except Exception:  # the device is broken beyond this: the original error says why
        pass


class CapturedCall:
    """``fn`` (device work on fixed tensors, no host values) captured once and replayed by calling the object.
    Where graphs are off, calling runs ``fn`` eagerly."""

    def __init__(self, fn: Callable[[], None], device: torch.device, capture: bool, pool=None):
        self.fn = fn
        self.graph = None
        self.capture_s = 0.0
        if capture:
            begin = time.perf_counter()
            self.graph, _ = capture_graph(fn, device, pool)
            torch.cuda.synchronize(device)
            self.capture_s = time.perf_counter() - begin

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [B, W] static input
    logits: torch.Tensor  # [B, W, V] static output
    #: the step slots captured with it: the graph reads their tensors, and its key holds their ``id``s, so they
    #: live as long as the graph (a freed slot's id could be reused by a new one, which would find this graph)
    slots: tuple = ()


class StepGraphs:
    """Captured steps of one `ModelRunner` (its cache must be allocated: capture after the prefill): each step one
    graph of the whole forward, on one GPU (`segments.SegmentGraphs` runs models over several GPUs)."""

    #: device work between steps (`CapturedCall`) may be captured into this runner's pool: it is one device's
    whole_steps = True

    def __init__(self, runner):
        self.runner = runner
        self.start = torch.zeros(runner.cache.batch_size, dtype=torch.long, device=runner.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, _Graph] = {}
        self.capture_s = 0.0  # total, over the runner's life
        self.captures = 0

    @staticmethod
    def _key(phase: Phase, width: int, slots: dict, draft_weights: bool = False) -> tuple:
        """``draft_weights``: draft steps run their own weights (`ModelRunner.draft_weights`), not the model's."""
        present = tuple(id(v) for v in slots.values() if v is not None)
        if not present and not (draft_weights and phase is Phase.DRAFT):
            return (None, width, ())  # a step without slots serves every phase
        return (phase, width, present)

    def key(self, phase: Phase, width: int, slots: dict) -> tuple:
        return self._key(phase, width, slots, self.runner.draft_weights is not None)

    def add(self, widths, phase: Phase, slots: dict) -> None:
        """Capture ``phase`` steps of each width in ``widths`` not captured yet (largest first: the pool is sized
        by the largest step and the smaller ones reuse it)."""
        begin = time.perf_counter()
        todo = [w for w in sorted(set(widths), reverse=True) if self.key(phase, w, slots) not in self.graphs]
        for width in todo:
            self._capture_one(width, phase, slots)
        if todo:
            torch.cuda.synchronize(self.runner.device)
            self.capture_s += time.perf_counter() - begin
            self.captures += len(todo)

    def _capture_one(self, width: int, phase: Phase, slots: dict) -> None:
        runner = self.runner
        try:
            ids = torch.zeros(runner.cache.batch_size, width, dtype=torch.long, device=runner.device)
            # warm-up writes land in the last cache slots, which every real step rewrites before reading; the
            # recurrent layers' rings, where those slots alias live entries, are put back
            first = runner.cache.capacity - width
            self.start.fill_(first)
            with runner.cache.keep_rings(first, width):
                graph, logits = capture_graph(lambda: self._step(ids, phase, slots), runner.device, self.pool)
        except Exception as err:
            raise RuntimeError(
                f"capturing a {phase.value} step of width {width}: {type(err).__name__}: {err}"
            ) from err
        kept = tuple(v for v in slots.values() if v is not None)
        self.graphs[self.key(phase, width, slots)] = _Graph(graph, ids, logits, kept)

    def _step(self, ids: torch.Tensor, phase: Phase, slots: dict) -> torch.Tensor:
        """The forward that gets captured: everything derived from ``start`` is computed inside the graph."""
        runner = self.runner
        step = StepContext(
            phase,
            self.start,
            runner.pad_t,
            q_len=ids.shape[1],
            kv_len=runner.cache.capacity,
            backend=runner.backend,
            **slots,
        )
        return runner.run_model(ids, step)

    def find(self, phase: Phase, width: int, slots: dict) -> _Graph | None:
        return self.graphs.get(self.key(phase, width, slots))

    def replay(self, entry: _Graph, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Run a captured step; returns its static ``[B, W, V]`` logits buffer."""
        entry.ids.copy_(ids)
        self.start.copy_(start)
        entry.graph.replay()
        return entry.logits
