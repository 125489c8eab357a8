"""`StepInfo`: what one forward of the decoding loop tells the attention layers.

The loop builds one `StepInfo` per forward and passes it to ``model(...)`` as the keyword ``speculation_step``;
transformers forwards unknown keywords down to every attention call, where the ``"sparse_verify"`` attention
reads it. Tensors derived from it (write indices, masks) are built once per device and reused by every layer on
that device, so a model split by accelerate over several GPUs pays once per GPU, not once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

PHASES = ("prefill", "draft", "verify")


@dataclass
class StepInfo:
    """One forward of ``q_len`` new tokens per row.

    Attributes:
        phase: ``"prefill"``, ``"draft"`` or ``"verify"`` (a plain decode step is a verify step with no drafts).
        start: ``[B]`` int64, cache slot of each row's first new token (rows may differ).
        pad: ``[B]`` int64, left padding of each row: cache slots ``[0, pad)`` are never attended to.
        q_len: new tokens per row in this forward.
        kv_len: host-side bound on ``max(start) + q_len``; attention reads cache slots ``[0, kv_len)``.
        layer_states: optional per-layer objects (indexed by ``module.layer_idx``) that strategies attach, for
            example KV selections for sparse drafting or score buffers the verify pass fills.
        backend: attention backend name (see `hf_sparse_verify.attention.dispatch`).
        no_padding: host-side fact that no row has left padding and every ``start`` is 0 (a fresh prefill of
            an unpadded batch), which lets backends use a plain causal kernel without a mask.
        uniform_start: host-side fact that every row has the same ``start`` (with ``no_padding``, a one-token step
            then attends to every slot below ``kv_len``: no mask needed).
    """

    phase: str
    start: torch.Tensor
    pad: torch.Tensor
    q_len: int
    kv_len: int
    layer_states: list[Any] | None = None
    backend: str = "reference"
    no_padding: bool = False
    uniform_start: bool = False
    _views: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if self.q_len < 1:
            raise ValueError(f"q_len must be >= 1, got {self.q_len}")

    def on(self, device: torch.device) -> DeviceView:
        """The per-device tensors of this step, built on first use."""
        key = str(device)
        view = self._views.get(key)
        if view is None:
            view = DeviceView(self, device)
            self._views[key] = view
        return view

    def layer_state(self, layer_idx: int) -> Any:
        if self.layer_states is None:
            return None
        return self.layer_states[layer_idx]


class DeviceView:
    """`StepInfo` tensors on one device: write indices and masks (memoized per sliding window)."""

    def __init__(self, step: StepInfo, device: torch.device):
        self.step = step
        self.device = device
        self.start = step.start.to(device, non_blocking=True)  # [B]
        self.pad = step.pad.to(device, non_blocking=True)  # [B]
        offsets = torch.arange(step.q_len, device=device)
        self.query_slots = self.start[:, None] + offsets  # [B, q] cache slot of each new token
        self._masks: dict[int | None, torch.Tensor] = {}

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
        """True when the mask is the plain causal mask of a fresh prefill (no padding, no window): host-side
        facts only, so no synchronisation."""
        step = self.step
        return (
            step.phase == "prefill" and step.no_padding and step.kv_len == step.q_len and not sliding_window
        )

    def is_full_row(self, sliding_window: int | None) -> bool:
        """True when one new token per row attends to every slot in ``[0, kv_len)`` (no padding, same start)."""
        step = self.step
        return step.q_len == 1 and step.no_padding and step.uniform_start and not sliding_window
