"""CUDA graphs for a model whose decoder layers an accelerate device map spreads over several GPUs: per step
(phase, width, step slots) one graph per device the step's work passes through, in order
(`hf_sparse_verify.placement.device_segments` groups consecutive layers on one GPU into segments).

A CUDA graph records one device's work, so a step is captured in pieces, cut where the work moves to another GPU.
Capture runs transformers' model forward once, its decoder layers `hf_sparse_verify.integrations.SegmentLayer`
wrappers that hand their calls to the `SegmentRun` the step carries (``StepContext.segments``):

- the first piece opens before the forward, on the model's first GPU: it records the forward's prologue (positions,
  embedding, rotary table, masks) and the layers of every segment on that GPU;
- the first layer of a segment on another GPU closes the open piece, copies what it is given (hidden state,
  rotary table, positions: every tensor of its arguments) into static buffers on its own GPU outside any graph
  (the hand-over), opens the next piece there and runs its segment's layers; the segment's other layers return
  the hidden state they are given (the first has run them);
- the last piece closes when the model's output embedding (the head) returns: the forward's tail (final norm,
  head) is in it, and the head's output is the step's static logits. Where the head is on another GPU than the
  last layers, the tail is a piece of its own there, handed the last hidden state.

A replay then runs no Python of the model at all: per piece, the hand-over copies and the graph (one H200 pair,
8B shape: transformers' forward with its accelerate hooks took 3.2 ms of host time per step, and the first GPU
waited for its prologue). Inside a piece the layers see a `StepContext` of their own whose ``start``/``pad`` are
fixed buffers on its GPU (copied from the step's before each replay), so nothing in a graph reads another GPU's
memory. Each piece is warmed up twice on its capture stream before the capture (the same forward with the pieces
switching streams but not capturing). A layer that is not given the same arguments as its segment's first layer
(models whose layers take per-layer inputs), or a final norm on another GPU than the head, fails the capture with a
clear error, and the loop runs eager steps. Off CUDA (tests) nothing is captured: a replay runs the forward again,
each segment's first layer copying its inputs into the captured static buffers, which tests the hand-over.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..._compat import decoder_layers
from ...placement import Segment
from ...step import Phase, StepContext, step_scope
from .graphs import WARMUP_FORWARDS, StepGraphs, release_generator


@dataclass
class _Piece:
    """One GPU's part of a captured step."""

    device: torch.device
    states: list  # the `_SegmentState`s whose layers it runs
    handover: list = field(
        default_factory=list
    )  # (static on this GPU, what it copies: a tensor of a piece before)
    graph: object = None  # torch.cuda.CUDAGraph (None off CUDA)


@dataclass
class _Captured:
    """A captured step: its pieces in order, its static input ids and its static logits."""

    ids: torch.Tensor
    pieces: list
    out: torch.Tensor | None = None


@dataclass
class _SegmentState:
    segment: Segment
    start: torch.Tensor  # [B] fixed, on the segment's device: the graphs' step reads it
    pad: torch.Tensor
    pool: object
    stream: object  # its capture stream (None off CUDA)
    recorded: tuple | None = (
        None  # while capturing: (output, flattened arguments) the other layers must match
    )
    statics: dict = field(
        default_factory=dict
    )  # step key -> its first layer's static inputs (hand-over targets)


@dataclass
class SegmentRun:
    """One step's hand-over to the segments: ``mode`` ``"warmup"``, ``"capture"`` or (off CUDA) ``"replay"`` of
    step ``key``; ``step`` is the runner's step (its ``start``/``pad`` are copied to each segment)."""

    graphs: SegmentGraphs
    mode: str
    key: tuple
    step: StepContext | None = None

    def layer_call(self, index: int, hidden: torch.Tensor, args: tuple, kwargs: dict):
        return self.graphs.layer_call(self, index, hidden, args, kwargs)


class SegmentGraphs:
    """Captured steps of one `ModelRunner` whose model spans several GPUs: per step key (the keys of `StepGraphs`)
    one graph per GPU the step passes through. Same interface as `StepGraphs` (``add``, ``find``, ``replay``,
    ``capture_s``, ``captures``).

    Args:
        runner: the `ModelRunner` (its cache allocated: capture after the prefill).
        segments: the model's device segments.
        cuda: capture CUDA graphs (False: nothing captured, replays rerun the forward; for tests off CUDA).
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
                torch.cuda.Stream(s.device) if cuda else None,
            )
            for s in segments
        ]
        self.by_layer = {
            i: (state, i == state.segment.layers[0]) for state in self.states for i in state.segment.layers
        }
        self.start = torch.zeros(batch, dtype=torch.long, device=runner.device)
        self.head_pool = torch.cuda.graph_pool_handle() if cuda else None
        self.head_stream = torch.cuda.Stream(runner.device) if cuda else None
        head = runner.model.get_output_embeddings()
        # the head's GPU: where it is not the last layers' one, the tail (final norm, head) is a piece of its own
        self.tail = None
        if cuda and head is not None and head.weight.device != segments[-1].device:
            self.tail = (
                head.weight.device,
                torch.cuda.graph_pool_handle(),
                torch.cuda.Stream(head.weight.device),
            )
        self.steps: dict[tuple, _Captured] = {}
        self.keys: dict[tuple, Phase] = {}
        self.capture_s = 0.0
        self.captures = 0
        self._building: _Captured | None = None  # the step being warmed up or captured
        self._open: tuple | None = None  # (piece, stream context, capturing) of the piece being recorded

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
        ids = torch.zeros(runner.cache.batch_size, width, dtype=torch.long, device=runner.device)
        # warm-up writes land in the last cache slots, which every real step rewrites before reading
        self.start.fill_(runner.cache.capacity - width)
        try:
            for _ in range(WARMUP_FORWARDS if self.cuda else 0):
                self._record(SegmentRun(self, "warmup", key), ids, phase, width, slots)
            self._synchronize()
            captured = self._record(SegmentRun(self, "capture", key), ids, phase, width, slots)
            missing = [s.segment for s in self.states if key not in s.statics]
            if missing:
                raise RuntimeError(
                    f"segments {missing} were not captured: the model's decoder layers are not SegmentLayers "
                    "(switch the model with speculation_mode(..., mode=Mode(device_segments=True)))"
                )
        except Exception as err:
            for state in self.states:
                state.statics.pop(key, None)
                state.recorded = None
            raise RuntimeError(
                f"capturing a {phase.value} step of width {width} per device segment: {type(err).__name__}: {err}"
            ) from err
        self.steps[key] = captured
        self.keys[key] = phase

    def _record(self, run: SegmentRun, ids, phase: Phase, width: int, slots: dict) -> _Captured:
        """One forward of the step in ``run.mode`` (``"warmup"``: the pieces switch streams; ``"capture"``: they
        capture), from before the forward to the head's output."""
        runner = self.runner
        for model in (runner.model, runner.draft_weights):
            config = getattr(model, "config", None)
            if hasattr(config, "get_text_config"):
                config = config.get_text_config()
            if getattr(config, "final_logit_softcapping", None):
                raise NotImplementedError(
                    "a model that scales its logits after the head (final_logit_softcapping) cannot have its "
                    "steps captured per device segment: the last piece ends at the head's output"
                )
        self._building = _Captured(ids, [_Piece(runner.device, [])])
        heads = {m.get_output_embeddings() for m in (runner.model, runner.draft_weights) if m is not None}
        hooks = [head.register_forward_hook(self._head_returned) for head in heads if head is not None]
        gc.disable()  # a collected object's CUDA destructor is an illegal call during capture (see capture_graph)
        try:
            self._begin(self._building.pieces[0], run.mode)
            runner.run_model(ids, self._step(run, phase, width, slots))
            if self._open is not None:
                raise RuntimeError("the model's forward never called its output embedding (the head)")
        finally:
            for hook in hooks:
                hook.remove()
            if self._open is not None:  # an error inside: leave the capture and the stream
                piece, context, capturing = self._open
                self._open = None
                if capturing:
                    with contextlib.suppress(Exception):
                        piece.graph.capture_end()
                context.__exit__(None, None, None)
                if capturing:
                    release_generator(piece.device)
            gc.enable()
        captured, self._building = self._building, None
        return captured

    def _begin(self, piece: _Piece, mode: str, state: _SegmentState | None = None) -> None:
        """Start recording ``piece`` on its GPU (the first segment ``state`` it runs; None: the prologue's piece or
        the tail's): its capture stream current, capturing when ``mode`` is capture."""
        if not self.cuda:
            self._open = (piece, contextlib.nullcontext(), False)
            return
        if state is not None:
            stream, pool = state.stream, state.pool
        elif piece.device == self.runner.device and len(self._building.pieces) == 1:
            stream, pool = self.head_stream, self.head_pool
        else:
            _, pool, stream = self.tail
        stream.wait_stream(torch.cuda.current_stream(piece.device))
        context = torch.cuda.stream(stream)
        context.__enter__()
        capturing = mode == "capture"
        if capturing:
            piece.graph = torch.cuda.CUDAGraph()
            piece.graph.capture_begin(pool=pool)
        self._open = (piece, context, capturing)

    def _end(self) -> _Piece:
        """Stop recording the open piece; the device's usual stream then waits for its work."""
        piece, context, capturing = self._open
        self._open = None
        try:
            if capturing:
                piece.graph.capture_end()
        finally:
            context.__exit__(None, None, None)
        if self.cuda:
            torch.cuda.current_stream(piece.device).wait_stream(context.stream)
        return piece

    def _head_returned(self, module, inputs, output) -> None:
        """The head's forward hook while recording: the last piece ends with the head's output (the logits)."""
        if self._open is None:
            return
        piece = self._open[0]
        if not isinstance(output, torch.Tensor) or output.device != piece.device:
            raise RuntimeError(
                f"the model's head returned {type(output).__name__} on {getattr(output, 'device', None)} while the "
                f"piece being captured runs on {piece.device} (a final norm on another GPU than the head?)"
            )
        self._end()
        self._building.out = output

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
            for device in {s.segment.device for s in self.states} | {self.runner.device}:
                torch.cuda.synchronize(device)

    # -------------------------------------------------------------------------------------------------- replay
    def find(self, phase: Phase, width: int, slots: dict):
        """The captured step for ``phase``, ``width`` and ``slots`` (None when not captured)."""
        key = StepGraphs._key(phase, width, slots)
        return (key, phase, slots) if key in self.keys else None

    def replay(self, entry, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Run a captured step; returns its logits (static: read them before the next step)."""
        key, phase, slots = entry
        captured = self.steps[key]
        if not self.cuda:  # no graphs: the forward again, its segments taking their inputs as a replay would
            run = SegmentRun(self, "replay", key)
            return self.runner.run_model(ids, self._step(run, phase, ids.shape[1], slots, start=start))
        captured.ids.copy_(ids, non_blocking=True)
        self.start.copy_(start, non_blocking=True)
        for piece in captured.pieces:
            with torch.cuda.device(piece.device):
                for static, source in piece.handover:
                    static.copy_(source, non_blocking=True)
                for state in piece.states:
                    state.start.copy_(self.start, non_blocking=True)
                    state.pad.copy_(self.runner.pad_t, non_blocking=True)
                piece.graph.replay()
        return captured.out

    # ------------------------------------------------------------------------------------------ the layers' side
    def layer_call(self, run: SegmentRun, index: int, hidden: torch.Tensor, args: tuple, kwargs: dict):
        """Decoder layer ``index``'s call in a segmented step (`hf_sparse_verify.integrations.SegmentLayer`)."""
        state, first = self.by_layer[index]
        if not first:
            if run.mode == "capture":
                self._check_same_inputs(state, index, hidden, args, kwargs)
            return hidden
        leaves, spec = tree_flatten((hidden, args, kwargs))
        device = state.segment.device
        if run.mode == "replay":  # off CUDA: what a replay's hand-over does, then the segment again
            statics, captured_spec = state.statics[run.key]
            if spec != captured_spec:
                raise RuntimeError(
                    f"decoder layer {index} is called with other arguments than at capture ({spec} against "
                    f"{captured_spec})"
                )
            for static, leaf in zip(statics, leaves):
                if static is not None:
                    static.copy_(leaf)
            state.start.copy_(run.step.start)
            state.pad.copy_(run.step.pad)
            return self._run_segment(state, run, statics, leaves, spec)
        piece = self._open[0] if self._open is not None else None
        if piece is None:
            raise RuntimeError(f"decoder layer {index} was called after the step's head")
        if not piece.states and piece.device == device:
            # the first segment, on the prologue's GPU: its piece goes on (its step buffers copied on that GPU)
            statics = [None] * len(leaves)
            state.start.copy_(run.step.start)
            state.pad.copy_(run.step.pad)
        else:  # the hand-over: outside any graph, into static buffers on this segment's GPU
            self._end()
            with torch.cuda.device(device) if self.cuda else contextlib.nullcontext():
                statics = [x.to(device, copy=True) if isinstance(x, torch.Tensor) else None for x in leaves]
                # the segment's own step buffers (outside the graph: a replay copies them before each piece)
                state.start.copy_(run.step.start)
                state.pad.copy_(run.step.pad)
            piece = _Piece(device, [])
            piece.handover = [(s, x) for s, x in zip(statics, leaves) if s is not None]
            self._building.pieces.append(piece)
            self._begin(piece, run.mode, state)
        piece.states.append(state)
        if run.mode == "capture":
            state.statics[run.key] = (statics, spec)
        out = self._run_segment(state, run, statics, leaves, spec)
        if self.tail is not None and state is self.states[-1]:
            # the head is on another GPU: the tail (final norm, head) is a piece there, handed the last hidden state
            self._end()
            device = self.tail[0]
            with torch.cuda.device(device):
                static = out.to(device, copy=True)
            piece = _Piece(device, [], [(static, out)])
            self._building.pieces.append(piece)
            self._begin(piece, run.mode)
            out = static
            state.recorded = (out, state.recorded[1])
        return out

    def _run_segment(self, state: _SegmentState, run: SegmentRun, statics, leaves, spec) -> torch.Tensor:
        """The segment's layers on its inputs (its static buffers where it has them), in its own step context."""
        s_hidden, s_args, s_kwargs = tree_unflatten(
            [s if s is not None else x for s, x in zip(statics, leaves)], spec
        )
        outer = run.step
        # a fresh context: its per-device tensors (write slots) are computed in the piece being recorded
        inner = StepContext(
            outer.phase, state.start, state.pad, q_len=outer.q_len, kv_len=outer.kv_len, backend=outer.backend,
            kv_selection=outer.kv_selection, scores=outer.scores, verify_sparsity=outer.verify_sparsity,
        )  # fmt: skip
        layers = decoder_layers(self.runner.model)
        h = s_hidden
        with step_scope(inner):
            for i in state.segment.layers:
                h = layers[i](h, *s_args, **s_kwargs)
        if not isinstance(h, torch.Tensor):
            raise NotImplementedError(
                f"decoder layers that return {type(h).__name__} (not a tensor) cannot run per device segment"
            )
        state.recorded = (h, leaves[1:])
        return h

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
