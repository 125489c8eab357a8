"""Self-speculative drafting: the target drafts for itself, each attention layer attending only to a selected set
of cached tokens (per row and layer, shared by the layer's heads) plus every token appended since the selection.

One drafter, pluggable selection policies (the Vegas paper's comparison set):

- ``vegas`` (Vegas, verification-guided): after every verify step, the top-k prefix tokens by the verify pass's
  own raw attention logits, head-averaged over the first and last query rows of the step (``selection=
  "two_rows"``, Collect-2-Query), over all rows (``"all"``, the paper's Eq. 2), or over the row of the last
  accepted token only (``"last_token"``, the SpecExtend-like baseline). The first selection is seeded from the
  prefill's last query rows.
- ``streaming`` (MagicDec-Stream): attention sinks plus the most recent tokens.
- ``quest`` (MagicDec-Quest): query-aware page selection recomputed at every draft step from per-page key
  summaries.

All use the same budget ``k = max(min_tokens, ceil(ratio * prefix length))``; a prefix no longer than the budget is
drafted with full attention. Drafting writes the draft tokens' keys into the target's cache; the verify pass
rewrites those slots with exact values, so the output stays the target's own (lossless).
"""

from __future__ import annotations

import math

import torch

from ...attention.selection import (
    SparseLayerState,
    budget,
    mask_to_index,
    prefix_valid,
    select_streaming,
    select_topk,
)
from ..state import DecodeState
from .base import Draft, Drafter, VerifyFeedback
from .sampling import pick_tokens

_COLLECT = {"two_rows": "two_rows", "all": "all_rows", "last_token": "per_row"}


class SelfSpecDrafter(Drafter):
    """The target drafts for itself with sparse attention; ``policy`` picks the KV selection."""

    policy = "vegas"

    def __init__(
        self,
        ratio: float = 0.07,
        min_tokens: int = 256,
        selection: str = "two_rows",
        sinks: int = 4,
        page_size: int = 16,
    ):
        if selection not in _COLLECT:
            raise ValueError(f"selection must be one of {sorted(_COLLECT)}, got {selection!r}")
        self.ratio = ratio
        self.min_tokens = min_tokens
        self.selection = selection
        self.sinks = sinks
        self.page_size = page_size
        self.target = None
        self.states: list[SparseLayerState] = []
        self.static_index = False  # CUDA-graph mode: selections are copied into fixed index buffers

    @classmethod
    def from_config(cls, config, target=None, draft_model=None) -> SelfSpecDrafter:
        if draft_model is not None:
            raise ValueError(f"strategy {cls.policy!r} drafts with the target itself: pass no draft_model")
        return cls(
            ratio=config.ratio,
            min_tokens=config.min_tokens,
            selection=config.selection,
            sinks=config.streaming_sinks,
            page_size=config.quest_page_size,
        )

    @property
    def needs_verify_states(self) -> bool:  # type: ignore[override]
        return self.policy == "vegas"

    @property
    def verify_graphable(self) -> bool:  # type: ignore[override]
        return self.policy == "vegas" and self.selection in ("two_rows", "all")

    def capture_graphs(self) -> None:
        """Capture the draft step (one token per row) with the selection in fixed index buffers. Quest selects
        pages inside every draft step and sliding-window layers gather on the host side: those stay eager."""
        config = self.target.model.config.get_text_config()
        layer_types = getattr(config, "layer_types", None) or []
        sliding = "sliding_attention" in layer_types or (
            getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        )
        if self.policy == "quest" or sliding:
            return
        capacity = self.target.cache.capacity
        self.index_slots = min(capacity, budget(capacity, self.ratio, self.min_tokens))
        self.static_index = True
        for layer, s in enumerate(self.states):
            self._make_static(layer, s)
        self.target.capture([1], "draft", self.states)

    # ------------------------------------------------------------------------------------------------ hooks
    def attach(self, target) -> None:
        self.target = target
        self.states = [SparseLayerState(page_size=self.page_size) for _ in range(len(target.cache.layers))]

    def layer_states(self, phase: str) -> list | None:
        if self.policy != "vegas":
            return None
        collect = "last_rows" if phase == "prefill" else _COLLECT[self.selection]
        for s in self.states:
            s.collect = collect
            s.scores = None
        return self.states

    def prefill(self, state: DecodeState) -> None:
        self._select([c - 1 for c in state.committed], accepted=None)

    def on_verify(self, feedback: VerifyFeedback) -> None:
        self._select([c - 1 for c in feedback.committed_before], accepted=feedback.accepted)

    # ------------------------------------------------------------------------------------------------ selection
    def _select(self, prefix_end: list[int], accepted: list[int | None] | None) -> None:
        """Make every layer's selection over prefix slots ``[pad, prefix_end)``."""
        device = self.target.device
        capacity = self.target.cache.capacity
        prefix = [max(0, e - p) for e, p in zip(prefix_end, self.target.pad)]
        budgets = [budget(n, self.ratio, self.min_tokens) for n in prefix]
        recent = torch.tensor(prefix_end, device=device)
        dense = all(n <= b for n, b in zip(prefix, budgets))
        for layer, s in enumerate(self.states):
            layer_device = self.target.cache.layer_device(layer) or device
            s.recent_start = recent.to(layer_device)
            s.prefix_end = max(prefix_end)
            s.recent_min = min(prefix_end)
            s.page_min = s.page_max = None
            s.selected = s.index = s.index_valid = s.index_count = None
            s.quest_budget = None
            pad = self.target.pad_t.to(layer_device)
            if dense:
                if self.static_index:
                    self._make_static(layer, s)
                continue
            if self.policy == "vegas":
                s.selected = select_topk(self._scores(s, accepted), pad, s.recent_start, budgets, capacity)
            elif self.policy == "streaming":
                s.selected = select_streaming(pad, s.recent_start, budgets, self.sinks, capacity)
            else:  # quest: pages chosen per draft step inside the attention
                pages = [math.ceil(b / self.page_size) for b in budgets]
                s.quest_budget = torch.tensor(pages, device=layer_device)
                s.quest_budget_max = max(pages)
                continue
            if self.static_index:
                self._make_static(layer, s)
                continue
            s.index, s.index_valid = mask_to_index(s.selected, max(budgets))
            s.index_count = s.index_valid.sum(dim=1)

    def _make_static(self, layer: int, s: SparseLayerState) -> None:
        """Write layer ``layer``'s selection (all of the prefix when none) into its fixed buffers: ``index``
        ``[B, index_slots]``, ``index_count`` and ``recent_start`` keep their storage from one selection to the next,
        so a captured draft step reads the current selection."""
        pad = self.target.pad_t.to(s.recent_start.device)
        selected = (
            s.selected
            if s.selected is not None
            else prefix_valid(pad, s.recent_start, self.target.cache.capacity)
        )
        index, valid = mask_to_index(selected, self.index_slots)
        buffers = s.static_buffers
        if buffers is None:
            buffers = (
                torch.zeros_like(index),
                torch.zeros_like(valid),
                index.new_zeros(index.shape[0]),
                s.recent_start.clone(),
            )
            s.static_buffers = buffers
        static_index, static_valid, static_count, static_recent = buffers
        static_index.copy_(index)
        static_valid.copy_(valid)
        static_count.copy_(valid.sum(dim=1))
        static_recent.copy_(s.recent_start)
        s.index, s.index_valid, s.index_count, s.recent_start = (
            static_index,
            static_valid,
            static_count,
            static_recent,
        )

    def _scores(self, s: SparseLayerState, accepted: list[int | None] | None) -> torch.Tensor:
        if s.scores is None:
            raise RuntimeError("the verify pass collected no attention scores for this layer")
        scores = s.scores
        if scores.dim() == 3:  # per-row logits: the row of the last accepted token
            rows = torch.tensor([a or 0 for a in accepted], device=scores.device)
            rows = rows.clamp_max(scores.shape[1] - 1)
            scores = scores[torch.arange(scores.shape[0], device=scores.device), rows]
        return scores

    # ------------------------------------------------------------------------------------------------ drafting
    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        start = [c - 1 for c in state.committed]
        token = state.tokens.gather(1, torch.tensor(start, device=state.tokens.device)[:, None]).squeeze(1)
        tokens, probs = [], []
        for i in range(num_tokens):
            logits = self.target.forward(
                token[:, None], [s + i for s in start], "draft", layer_states=self.states
            )[:, 0]
            token, prob = pick_tokens(logits, state)
            tokens.append(token)
            probs.append(prob)
        counts = [num_tokens if a else 0 for a in state.active]
        return Draft(
            torch.stack(tokens, dim=1), counts, torch.stack(probs, dim=1) if state.do_sample else None
        )

    def close(self) -> None:
        self.target = None
        self.states = []


class VegasDrafter(SelfSpecDrafter):
    policy = "vegas"


class StreamingDrafter(SelfSpecDrafter):
    policy = "streaming"


class QuestDrafter(SelfSpecDrafter):
    policy = "quest"
