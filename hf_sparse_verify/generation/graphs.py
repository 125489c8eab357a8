"""CUDA graphs for decode, verify and draft steps: one graph per (phase, width), one shared memory pool, static
input buffers.

A captured step is the runner's ordinary forward with the ``"triton"`` attention backend, whose kernels read each
row's valid cache range from the device-side ``start``/``pad`` buffers and (for sparse drafting) the selection
from the layer states' index buffers; so a graph captured once replays correctly at every later length, and
changing K between steps only picks another graph. Replay copies the step's token ids and start slots into the
static buffers, replays, and returns the static logits buffer (valid until the next replay of the same graph).

Steps without layer states are captured once per width and serve every phase. Steps with layer states (Vegas'
score-collecting verify, self-speculative draft steps) are captured for that phase and that list of states: the
states' input tensors must stay the same objects (the drafter copies new selections into them), and tensors the
attention assigns to the states during capture (collected scores) are assigned again after each replay.
"""

from __future__ import annotations

import gc
import time
import warnings
from dataclasses import dataclass

import torch

from ..attention import StepInfo

#: forwards run on a side stream before capturing a graph (Triton compilation, cuBLAS workspaces)
WARMUP_FORWARDS = 2

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """A warning shown once per process for ``key``."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor  # [B, W] static input
    logits: torch.Tensor  # [B, W, V] static output
    layer_states: list | None
    scores: list | None  # per layer, what the captured step assigned to ``state.scores``


class StepGraphs:
    """Captured steps of one `ModelRunner` (its cache must be allocated: capture after the prefill)."""

    def __init__(self, runner):
        self.runner = runner
        self.start = torch.zeros(runner.cache.batch_size, dtype=torch.long, device=runner.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, _Graph] = {}
        self.capture_s = 0.0

    @staticmethod
    def _key(phase: str | None, width: int, layer_states: list | None) -> tuple:
        if layer_states is None:
            return (None, width, None)
        return (phase, width, id(layer_states))

    def add(self, widths, phase: str = "verify", layer_states: list | None = None) -> None:
        """Capture ``phase`` steps of each width in ``widths`` (largest first: the pool is sized by the largest
        step and the smaller ones reuse it)."""
        runner = self.runner
        device = runner.device
        begin = time.perf_counter()
        side = torch.cuda.Stream(device)
        for width in sorted(set(widths), reverse=True):
            self._capture_one(width, phase, layer_states, side)
        torch.cuda.synchronize(device)
        self.capture_s += time.perf_counter() - begin

    def _capture_one(self, width: int, phase: str, layer_states: list | None, side) -> None:
        runner = self.runner
        device = runner.device
        try:
            ids = torch.zeros(runner.cache.batch_size, width, dtype=torch.long, device=device)
            # warm-up writes land in the last cache slots, which every real step rewrites before reading
            self.start.fill_(runner.cache.capacity - width)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_FORWARDS):
                    self._step(ids, phase, layer_states)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # no garbage collection inside the capture: a collected object's CUDA destructor (an event, say) is an
            # illegal call during capture whose error is swallowed, and the capture then fails at the next launch
            gc.disable()
            try:
                with torch.cuda.graph(graph, pool=self.pool):
                    logits = self._step(ids, phase, layer_states)
            finally:
                gc.enable()
        except Exception as err:
            raise RuntimeError(
                f"capturing a {phase} step of width {width}: {type(err).__name__}: {err}"
            ) from err
        scores = [s.scores for s in layer_states] if layer_states is not None else None
        self.graphs[self._key(phase, width, layer_states)] = _Graph(graph, ids, logits, layer_states, scores)

    def _step(self, ids: torch.Tensor, phase: str, layer_states: list | None) -> torch.Tensor:
        """The forward that gets captured: everything derived from ``start`` is computed inside the graph."""
        runner = self.runner
        step = StepInfo(
            phase,
            self.start,
            runner.pad_t,
            q_len=ids.shape[1],
            kv_len=runner.cache.capacity,
            layer_states=layer_states,
            backend=runner.backend,
        )
        return runner.run_model(ids, step)

    def find(self, phase: str, width: int, layer_states: list | None) -> _Graph | None:
        return self.graphs.get(self._key(phase, width, layer_states))

    def replay(self, entry: _Graph, ids: torch.Tensor, start: list[int]) -> torch.Tensor:
        """Run a captured step; returns its static ``[B, W, V]`` logits buffer."""
        entry.ids.copy_(ids, non_blocking=True)
        self.start.copy_(torch.tensor(start, dtype=torch.long), non_blocking=True)
        entry.graph.replay()
        if entry.scores is not None:
            for state, scores in zip(entry.layer_states, entry.scores):
                state.scores = scores
        return entry.logits
