"""CUDA graphs for a model whose decoder layers an accelerate device map spreads over several GPUs: per step
(phase, width, step slots) one graph per device segment, a run of consecutive layers on one GPU
(`hf_sparse_verify.placement.device_segments`).

A CUDA graph records one device's work, so the step is not captured whole. transformers' model forward runs as it
is (embedding, rotary table, final norm and head eager, a few launches); its decoder layers are
`hf_sparse_verify.integrations.SegmentLayer` wrappers for the call, which hand their calls to the `SegmentRun` the
step carries (``StepContext.segments``):

- the first layer of a segment copies what it is given (hidden state, rotary table, positions: every tensor of its
  arguments) into the segment's static buffers on its GPU, outside any graph (the hand-over between GPUs), then
  replays the segment's graph, which runs all of the segment's layers, and returns the graph's static output;
- the segment's other layers return the hidden state they are given: the graph has run them.

Inside a segment's graph the layers see a `StepContext` of their own whose ``start``/``pad`` are fixed buffers on
the segment's GPU (copied from the step's before each replay), so nothing in a graph reads another GPU's memory.
Capture runs the model forward once per (phase, width, slots) with the step's ``segments`` in capture mode: each
segment's first layer captures the segment then (on a side stream of its GPU, with two warm-up runs first, as
`graphs.StepGraphs` does). A layer that is not given the same arguments as its segment's first layer (models whose
layers take per-layer inputs) fails the capture with a clear error, and the loop runs eager steps.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..._compat import decoder_layers
from ...placement import Segment
from ...step import Phase, StepContext, step_scope
from .graphs import StepGraphs, capture_graph


class _EagerGraph:
    """Off CUDA (tests of the hand-over on CPU): ``replay`` runs the segment again on the same static buffers and
    copies its result into the static output, as a graph's replay leaves it there."""

    def __init__(self, fn, out: torch.Tensor):
        self.fn = fn
        self.out = out

    def replay(self) -> None:
        self.out.copy_(self.fn())


@dataclass
class _Entry:
    graph: object  # torch.cuda.CUDAGraph (or _EagerGraph off CUDA)
    statics: (
        list  # per flattened argument: its static tensor on the segment's device, or None (kept as captured)
    )
    constants: list  # per flattened argument: the non-tensor value captured (None where a tensor)
    spec: object  # the arguments' tree structure
    out: torch.Tensor  # static output hidden state


@dataclass
class _SegmentState:
    segment: Segment
    start: torch.Tensor  # [B] fixed, on the segment's device: the graphs' step reads it
    pad: torch.Tensor
    pool: object
    entries: dict = field(default_factory=dict)
    recorded: tuple | None = (
        None  # while capturing: (output, flattened arguments) the other layers must match
    )


@dataclass
class SegmentRun:
    """One step's hand-over to the segments: ``mode`` ``"capture"`` or ``"replay"`` of graph ``key``; ``step`` is
    the runner's step (its ``start``/``pad`` are copied to each segment)."""

    graphs: SegmentGraphs
    mode: str
    key: tuple
    step: StepContext | None = None

    def layer_call(self, index: int, hidden: torch.Tensor, args: tuple, kwargs: dict):
        return self.graphs.layer_call(self, index, hidden, args, kwargs)


class SegmentGraphs:
    """Captured steps of one `ModelRunner` whose model spans several GPUs: one graph per device segment and step
    key (the keys of `StepGraphs`). Same interface as `StepGraphs` (``add``, ``find``, ``replay``,
    ``capture_s``, ``captures``).

    Args:
        runner: the `ModelRunner` (its cache allocated: capture after the prefill).
        segments: the model's device segments.
        cuda: capture CUDA graphs (False: `_EagerGraph` stand-ins, for tests off CUDA).
    """

    #: work between steps (`CapturedCall`) stays eager: it touches buffers on every GPU
    whole_steps = False

    def __init__(self, runner, segments: list[Segment], cuda: bool = True):
        self.runner = runner
        self.cuda = cuda
        batch = runner.cache.batch_size
        self.states = [
            _SegmentState(
                s,
                torch.zeros(batch, dtype=torch.long, device=s.device),
                torch.zeros(batch, dtype=torch.long, device=s.device),
                torch.cuda.graph_pool_handle() if cuda else None,
            )
            for s in segments
        ]
        self.by_layer = {
            i: (state, i == state.segment.layers[0]) for state in self.states for i in state.segment.layers
        }
        self.start = torch.zeros(batch, dtype=torch.long, device=runner.device)
        self.keys: dict[tuple, Phase] = {}
        self.capture_s = 0.0
        self.captures = 0

    # ------------------------------------------------------------------------------------------------- capture
    def add(self, widths, phase: Phase, slots: dict) -> None:
        """Capture ``phase`` steps of each width in ``widths`` not captured yet (largest first)."""
        begin = time.perf_counter()
        todo = [
            w for w in sorted(set(widths), reverse=True) if StepGraphs._key(phase, w, slots) not in self.keys
        ]
        for width in todo:
            self._capture_width(width, phase, slots)
        if todo:
            self._synchronize()
            self.capture_s += time.perf_counter() - begin
            self.captures += len(todo)

    def _capture_width(self, width: int, phase: Phase, slots: dict) -> None:
        runner = self.runner
        key = StepGraphs._key(phase, width, slots)
        try:
            ids = torch.zeros(runner.cache.batch_size, width, dtype=torch.long, device=runner.device)
            # warm-up writes land in the last cache slots, which every real step rewrites before reading
            self.start.fill_(runner.cache.capacity - width)
            run = SegmentRun(self, "capture", key)
            runner.run_model(ids, self._step(run, phase, width, slots))
            missing = [s.segment for s in self.states if key not in s.entries]
            if missing:
                raise RuntimeError(
                    f"segments {missing} were not captured: the model's decoder layers are not SegmentLayers "
                    "(switch the model with speculation_mode(..., mode=Mode(device_segments=True)))"
                )
        except Exception as err:
            for state in self.states:
                state.entries.pop(key, None)
                state.recorded = None
            raise RuntimeError(
                f"capturing a {phase.value} step of width {width} per device segment: {type(err).__name__}: {err}"
            ) from err
        self.keys[key] = phase

    def _step(self, run: SegmentRun, phase: Phase, width: int, slots: dict, start=None) -> StepContext:
        runner = self.runner
        step = StepContext(
            phase,
            self.start if start is None else start,
            runner.pad_t,
            q_len=width,
            kv_len=runner.cache.capacity,
            backend=runner.backend,
            segments=run,
            **slots,
        )
        run.step = step
        return step

    def _synchronize(self) -> None:
        if self.cuda:
            for device in {s.segment.device for s in self.states}:
                torch.cuda.synchronize(device)

    # -------------------------------------------------------------------------------------------------- replay
    def find(self, phase: Phase, width: int, slots: dict):
        """The captured step for ``phase``, ``width`` and ``slots`` (None when not captured)."""
        key = StepGraphs._key(phase, width, slots)
        return (key, phase, slots) if key in self.keys else None

    def replay(self, entry, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Run a captured step: the model forward with every segment replayed; returns its logits."""
        key, phase, slots = entry
        run = SegmentRun(self, "replay", key)
        return self.runner.run_model(ids, self._step(run, phase, ids.shape[1], slots, start=start))

    # ------------------------------------------------------------------------------------------ the layers' side
    def layer_call(self, run: SegmentRun, index: int, hidden: torch.Tensor, args: tuple, kwargs: dict):
        """Decoder layer ``index``'s call in a segmented step (`hf_sparse_verify.integrations.SegmentLayer`)."""
        state, first = self.by_layer[index]
        if not first:
            if run.mode == "capture":
                self._check_same_inputs(state, index, hidden, args, kwargs)
            return hidden
        if run.mode == "capture":
            return self._capture_segment(state, run, hidden, args, kwargs)
        entry = state.entries[run.key]
        leaves, spec = tree_flatten((hidden, args, kwargs))
        if spec != entry.spec:
            raise RuntimeError(
                f"decoder layer {index} is called with other arguments than at capture ({spec} against {entry.spec})"
            )
        device = state.segment.device
        with torch.cuda.device(device) if self.cuda else contextlib.nullcontext():
            for static, constant, leaf in zip(entry.statics, entry.constants, leaves):
                if static is not None:
                    static.copy_(leaf, non_blocking=True)
                elif leaf is not constant and leaf != constant:
                    raise RuntimeError(
                        f"decoder layer {index} is given {leaf!r} where its captured step was given {constant!r}"
                    )
            state.start.copy_(run.step.start, non_blocking=True)
            state.pad.copy_(run.step.pad, non_blocking=True)
            entry.graph.replay()
        return entry.out

    def _capture_segment(self, state: _SegmentState, run: SegmentRun, hidden, args, kwargs) -> torch.Tensor:
        segment = state.segment
        device = segment.device
        leaves, spec = tree_flatten((hidden, args, kwargs))
        statics = [x.to(device, copy=True) if isinstance(x, torch.Tensor) else None for x in leaves]
        constants = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        s_hidden, s_args, s_kwargs = tree_unflatten(
            [s if s is not None else x for s, x in zip(statics, leaves)], spec
        )
        state.start.copy_(run.step.start)
        state.pad.copy_(run.step.pad)
        outer = run.step
        slots = {
            "kv_selection": outer.kv_selection,
            "scores": outer.scores,
            "verify_sparsity": outer.verify_sparsity,
        }
        layers = decoder_layers(self.runner.model)

        def fn() -> torch.Tensor:
            # a fresh context each run: its per-device tensors (write slots) are then computed inside the graph
            inner = StepContext(
                outer.phase, state.start, state.pad, q_len=outer.q_len, kv_len=outer.kv_len,
                backend=outer.backend, **slots,
            )  # fmt: skip
            h = s_hidden
            with step_scope(inner):
                for i in segment.layers:
                    h = layers[i](h, *s_args, **s_kwargs)
            if not isinstance(h, torch.Tensor):
                raise NotImplementedError(
                    f"decoder layers that return {type(h).__name__} (not a tensor) cannot run per device segment"
                )
            return h

        if self.cuda:
            graph, out = capture_graph(fn, device, state.pool)
        else:
            out = fn()
            graph = _EagerGraph(fn, out)
        state.entries[run.key] = _Entry(graph, statics, constants, spec, out)
        state.recorded = (out, leaves[1:])
        return out

    @staticmethod
    def _check_same_inputs(state: _SegmentState, index: int, hidden, args, kwargs) -> None:
        out, recorded = state.recorded
        leaves, _ = tree_flatten((args, kwargs))
        same = len(leaves) == len(recorded) and all(
            a is b or (not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b)
            for a, b in zip(leaves, recorded)
        )
        if hidden is not out or not same:
            raise RuntimeError(
                f"decoder layer {index} is given other inputs than the first layer of its device segment "
                f"({state.segment.layers.start}): its segment cannot run as one graph"
            )
