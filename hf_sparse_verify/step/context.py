"""`StepContext`: what one forward of the decoding loop tells the modules that run in it.

The runner opens a :func:`step_scope` around each ``model(...)`` call; the ``"sparse_verify"`` attention, the
`SpecCache` and replaced modules (MLP, experts) read the open context with :func:`current_step`. There is no other
channel: no keyword fished out of ``**kwargs``, no attribute set on the cache. Tensors derived from the context
(write slots, masks) are built once per device and shared by every layer on that device.

A captured CUDA graph runs this Python once, at capture: everything the graph needs at replay time must then live
in tensors the context points to (``start``, ``pad``, the slots' buffers), never in host values.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .slots import KVSelection, ScoreCollection, VerifySparsity


class Phase(str, enum.Enum):
    """Which forward of the loop a step is. A plain decode step is a verify step with no drafts."""

    PREFILL = "prefill"
    DRAFT = "draft"
    VERIFY = "verify"


@dataclass
class StepContext:
    """One forward of ``q_len`` new tokens per row.

    Attributes:
        phase: `Phase` (a plain string such as ``"verify"`` is accepted and converted).
        start: ``[B]`` int64 on the model's first device, cache slot of each row's first new token.
        pad: ``[B]`` int64, left padding per row: slots ``[0, pad)`` are never attended to.
        q_len: new tokens per row.
        kv_len: host-side bound on ``max(start) + q_len`` (the capacity in captured steps); backends that slice
            the cache read slots ``[0, kv_len)``.
        backend: attention backend name (see `hf_sparse_verify.attention.dispatch`).
        no_padding / uniform_start: host-side facts (no row padded and every start 0 / every row at the same
            start) that let eager backends skip masks; always False in captured steps.
        host_pad: ``pad`` as host integers, given to eager prefill steps (per-row attention of padded prompts
            without a read back); None elsewhere.
        kv_selection: draft-time KV selection (owner: the self-speculative drafter), read by draft steps.
        scores: attention-score collection (owner: the Vegas drafter), written by verify and prefill steps.
        verify_sparsity: verify-time sparsity (owner: sparse verification), read by verify steps.
        segments: the runner's per-device graphs when a model over several GPUs captures or replays this step
            (`hf_sparse_verify.generation.engine.segments.SegmentRun`): its decoder layers hand their calls to it.
            None in every other step.
    """

    phase: Phase
    start: torch.Tensor
    pad: torch.Tensor
    q_len: int
    kv_len: int
    backend: str = "reference"
    no_padding: bool = False
    uniform_start: bool = False
    host_pad: tuple[int, ...] | None = None
    kv_selection: KVSelection | None = None
    scores: ScoreCollection | None = None
    verify_sparsity: VerifySparsity | None = None
    segments: object | None = None
    _views: dict = field(default_factory=dict, repr=False)
    _tokens: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        try:
            self.phase = Phase(self.phase)
        except ValueError:
            raise ValueError(f"phase must be one of {[p.value for p in Phase]}, got {self.phase!r}") from None
        if self.q_len < 1:
            raise ValueError(f"q_len must be >= 1, got {self.q_len}")

    def token(self, index: int) -> StepContext:
        """The context of this step's token ``index`` alone (one new token per row at ``start + index``): layers
        whose state advances token by token (`hf_sparse_verify.integrations.recurrent.TokenByToken`) run a step
        as one call per token. Built once per step and token, shared by every such layer."""
        context = self._tokens.get(index)
        if context is None:
            context = self._tokens[index] = dataclasses.replace(
                self,
                start=self.start + index,
                q_len=1,
                kv_len=self.kv_len - self.q_len + index + 1,
                no_padding=False,
                uniform_start=False,
                host_pad=None,
                _views={},
                _tokens={},
            )
        return context

    def on(self, device: torch.device) -> DeviceView:
        """The per-device tensors of this step, built on first use."""
        key = str(device)
        view = self._views.get(key)
        if view is None:
            view = DeviceView(self, device)
            self._views[key] = view
        return view

    def draft_selection(self) -> KVSelection | None:
        """The KV selection a draft step reads (None outside draft steps)."""
        return self.kv_selection if self.phase is Phase.DRAFT else None

    def sparsity(self) -> VerifySparsity | None:
        """The verify-time sparsity this step applies (verify steps only; None on every lossless path)."""
        return self.verify_sparsity if self.phase is Phase.VERIFY else None

    def score_collection(self) -> ScoreCollection | None:
        """The score collection this step writes (prefill and verify steps only)."""
        return self.scores if self.phase is not Phase.DRAFT else None


_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("hsv_step", default=None)


@contextlib.contextmanager
def step_scope(step: StepContext) -> Iterator[StepContext]:
    """Make ``step`` the current step for the block (restored on exit, also on errors)."""
    token = _CURRENT.set(step)
    try:
        yield step
    finally:
        _CURRENT.reset(token)


def current_step(required: bool = True) -> StepContext | None:
    """The step of the forward that is running; raises (or returns None) outside the decoding loop."""
    step = _CURRENT.get()
    if step is None and required:
        raise RuntimeError(
            "no hf_sparse_verify step is running: the 'sparse_verify' attention and SpecCache work only inside "
            "hf_sparse_verify's decoding loop; set the model back to 'sdpa' or 'eager' for other calls"
        )
    return step


class DeviceView:
    """`StepContext` tensors on one device: write slots and masks (memoized per sliding window)."""

    def __init__(self, step: StepContext, device: torch.device):
        self.step = step
        self.device = device
        self.start = step.start.to(device, non_blocking=True)  # [B]
        self.pad = step.pad.to(device, non_blocking=True)  # [B]
        offsets = torch.arange(step.q_len, device=device)
        self.query_slots = self.start[:, None] + offsets  # [B, q] cache slot of each new token
        self._masks: dict[int | None, torch.Tensor] = {}
        self.extra: dict = {}  # per-step tensors a slot's owner shares across layers (e.g. block masks)

    def mask(self, sliding_window: int | None) -> torch.Tensor:
        """Boolean ``[B, 1, q_len, kv_len]``: True where a query may attend to a cache slot.

        A query attends to slots ``pad <= j <= its own slot`` (and ``j > slot - sliding_window`` on sliding
        layers). A query always sees its own slot, so the rows of left-padding queries stay finite.
        """
        window = int(sliding_window) if sliding_window else None
        mask = self._masks.get(window)
        if mask is None:
            slots = torch.arange(self.step.kv_len, device=self.device)  # [L]
            q = self.query_slots[:, :, None]  # [B, q, 1]
            mask = (slots <= q) & (slots >= self.pad[:, None, None])
            if window is not None:
                mask &= slots > q - window
            mask |= slots == q
            mask = mask[:, None]
            self._masks[window] = mask
        return mask

    def is_plain_causal(self, sliding_window: int | None) -> bool:
        """True for the plain causal mask of a fresh unpadded prefill (host-side facts only: no sync)."""
        step = self.step
        return (
            step.phase is Phase.PREFILL
            and step.no_padding
            and step.kv_len == step.q_len
            and not sliding_window
        )

    def is_prefill_chunk(self, sliding_window: int | None) -> bool:
        """True for a prefill chunk whose ``q_len`` new tokens end at ``kv_len`` in every row, on a full-attention
        layer: its mask is causal aligned to the lower right, past each row's padding (host-side facts only)."""
        step = self.step
        return (
            step.phase is Phase.PREFILL
            and step.uniform_start
            and step.kv_len >= step.q_len
            and not sliding_window
        )

    def is_chunk_causal(self, sliding_window: int | None) -> bool:
        """True for an unpadded `is_prefill_chunk`: every row attends causally to all slots before its tokens."""
        return self.step.no_padding and self.is_prefill_chunk(sliding_window)

    def is_full_row(self, sliding_window: int | None) -> bool:
        """True when one new token per row attends to every slot in ``[0, kv_len)`` (no padding, same start)."""
        step = self.step
        return step.q_len == 1 and step.no_padding and step.uniform_start and not sliding_window
