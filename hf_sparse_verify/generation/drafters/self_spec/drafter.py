"""Self-speculative drafting: the target drafts for itself, each attention layer attending only to a selected set
of cached tokens (per row and layer, shared by the layer's heads) plus every token appended since the selection.

One drafter, pluggable selection policies (the Vegas paper's comparison set):

- ``vegas`` (verification-guided): after every verify step, the top-k prefix tokens by the verify pass's own
  attention, averaged over query heads and over the first and last query rows of the step (``selection=
  "two_rows"``, Collect-2-Query), all rows (``"all"``, the paper's Eq. 2) or the row of the last accepted token
  (``"last_token"``, the SpecExtend-like baseline). Scores are softmax weights by default (as the released Vegas
  code; ``vegas_scores="logits"`` gives the paper text's raw logits). The first selection comes from the
  prefill's last query rows.
- ``streaming`` (MagicDec-Stream): attention sinks plus the most recent tokens.
- ``quest`` (MagicDec-Quest): query-aware page selection recomputed at every draft step from per-page key
  summaries.

All use the budget ``k = max(min_tokens, ceil(ratio * prefix length))``; a prefix no longer than the budget is
drafted with all of it. The selection update after a verify step is device work over all layers at once (one
top-k per device), captured in a CUDA graph with the draft step where graphs run. Drafting writes the draft
tokens' keys into the target's cache; the verify pass rewrites those slots with exact values, so the output stays
the target's own (lossless).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...._compat import indexed_attention
from ....attention.cache import SpecConvLayer
from ....step import Phase, ScoreCollection
from ...engine.graphs import CapturedCall
from ...engine.state import DecodeState
from ..base import Draft, Drafter, VerifyFeedback
from ..low_bit import low_bit_draft_for
from ..sampling import pick_tokens
from .selection import IndexSelection, QuestSelection, budget, kept_counts, streaming_index, topk_index

_ROWS = {"two_rows": "two_rows", "all": "all_rows", "last_token": "per_row"}


@dataclass
class _Buffers:
    """What a session keeps for this drafter: the selection, the score buffers and the captured update."""

    selection: IndexSelection | QuestSelection
    collection: ScoreCollection | None
    recent_src: torch.Tensor  # [B] prefix end of the next selection (fixed: the captured update reads it)
    accepted_src: torch.Tensor  # [B] accepted drafts of the last verify step ("last_token" scores)
    update: CapturedCall | None = None
    draft_captured: bool = False


class SelfSpecDrafter(Drafter):
    """The target drafts for itself with sparse attention; each subclass says how it selects (`_fill`), what
    selection it keeps (`_make_selection`) and whether its verify steps collect scores (`collects_scores`)."""

    #: the strategy name (configuration and session key)
    policy = "self_spec"
    reads_target_cache = True
    tunes_ratio = True
    #: verify and prefill steps write attention scores for the selection (Vegas)
    collects_scores = False

    def __init__(
        self,
        ratio: float = 0.07,
        min_tokens: int = 256,
        selection: str = "two_rows",
        sinks: int = 4,
        page_size: int = 16,
        weights: bool = True,
        lse: str = "step",
        recent_share: float = 0.875,
        max_k: int = 16,
        pool: int = 7,
        draft_weights: torch.nn.Module | None = None,
    ):
        if selection not in _ROWS:
            raise ValueError(f"selection must be one of {sorted(_ROWS)}, got {selection!r}")
        self.ratio = ratio
        self.min_tokens = min_tokens
        self.selection = selection
        self.sinks = sinks
        self.page_size = page_size
        self.weights = weights
        self.lse = lse
        self.recent_share = recent_share
        self.max_k = max_k
        self.pool = pool
        self.draft_weights = draft_weights  # a low-bit copy of the target that runs the draft steps, or None
        self.models = (draft_weights,) if draft_weights is not None else ()
        self.target = None
        self.session = None
        self.buffers: _Buffers | None = None
        self.capture_s = 0.0
        self._updated = False  # `after_verify` ran for the step being settled
        self._carried_seed: dict[int, torch.Tensor] = {}

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
            weights=config.vegas_scores == "weights",
            lse=config.vegas_lse,
            recent_share=config.vegas_recent_share,
            max_k=config.max_draft_tokens,
            pool=config.vegas_pool,
            draft_weights=None
            if config.draft_weights is None
            else low_bit_draft_for(target, config.draft_weights, config.draft_weight_group),
        )

    @property
    def low_bit_weights(self) -> str | None:
        return None if self.draft_weights is None else self.draft_weights.config.low_bit_draft

    def session_key(self) -> tuple:
        return (
            self.policy,
            self.ratio,
            self.min_tokens,
            self.selection,
            self.sinks,
            self.page_size,
            self.weights,
            self.lse,
            self.recent_share,
            self.max_k,
            self.pool,
            None
            if self.draft_weights is None
            else (self.draft_weights.config.low_bit_draft, id(self.draft_weights)),
        )

    # ------------------------------------------------------------------------------------------------ hooks
    def attach(self, target, state: DecodeState, session) -> None:
        if any(isinstance(layer, SpecConvLayer) for layer in target.cache.layers):
            model_type = target.model.config.get_text_config(decoder=True).model_type
            raise NotImplementedError(
                f"model type {model_type!r} ({type(target.model).__name__}) is not supported: self-speculation "
                "(Vegas, Streaming, Quest) selects KV per attention layer, and it has recurrent layers (a hybrid such "
                "as LFM2 or Qwen3-Next, or a state-space model such as Mamba); use strategy='prompt_lookup', "
                "'draft_model' or 'auto'"
            )
        if indexed_attention(target.model.config):
            model_type = target.model.config.get_text_config(decoder=True).model_type
            raise NotImplementedError(
                f"model type {model_type!r} ({type(target.model).__name__}) is not supported: self-speculation "
                "(Vegas, Streaming, Quest) selects KV from the attention's scores, and this model's attention already "
                "attends to the top-k slots its DSA indexer selects (no scores are collected there); use "
                "strategy='prompt_lookup', 'draft_model' or 'auto'"
            )
        if self.draft_weights is not None and target.segments:
            raise NotImplementedError(
                "draft_weights with a model spread over several GPUs is not supported: leave draft_weights=None"
            )
        target.draft_weights = self.draft_weights  # draft steps run the low-bit copy (None: the model's own)
        self.target = target
        self.session = session
        self.capture_s = 0.0
        self.buffers = session.drafter_state if session is not None else None
        if self.buffers is None and self.collects_scores:  # the prefill writes the first scores
            self._collection = ScoreCollection(_ROWS[self.selection], weights=self.weights, lse=self.lse)
        elif self.buffers is not None:
            self._collection = self.buffers.collection

    def step_slots(self, phase: Phase) -> dict:
        if not self.collects_scores or phase is Phase.DRAFT:
            return {}
        return {"scores": self._collection}

    def prefill(self, state: DecodeState) -> None:
        if self.buffers is None:
            self.buffers = self._make_buffers(state)
            if self.session is not None:
                self.session.drafter_state = self.buffers
        collection = self.buffers.collection
        if collection is not None:
            for layer in range(len(self.target.cache.layers)):  # the prefill's scores into the fixed buffers
                collection.write(layer, collection.layer(layer))
            # verify captures' warm-up steps overwrite the carried log-sum-exp: `capture` puts the prefill's back
            self._carried_seed = {layer: lse.clone() for layer, lse in collection.carried.items()}
        self.buffers.recent_src.copy_(state.pending_slots())  # the whole prompt is the prefix
        self.buffers.accepted_src.zero_()
        self._update()
        self._set_host_bounds([c - 1 for c in state.committed])

    def capture(self, widths) -> None:
        """Capture the selection update and, on models without sliding-window layers, the draft step (one token
        per row; Quest's page choice for the step's query is inside it)."""
        buffers = self.buffers
        device = self.target.device
        if buffers.collection is not None:
            for layer, seed in self._carried_seed.items():
                buffers.collection.carried[layer].copy_(seed)
        # over several GPUs the update touches every GPU's buffers: it stays eager there (`after_verify` runs it)
        if buffers.update is None and self.selection != "last_token" and self.target.graphs.whole_steps:
            # capturing runs the update on whatever the score buffers hold (the verify captures' warm-up
            # scores): keep the prefill's selection and put it back afterwards
            stacks = [t for s in buffers.selection.stacks() for _, t in s.groups]
            saved = [t.clone() for t in stacks]
            buffers.update = CapturedCall(self._update, device, capture=True, pool=self.target.graphs.pool)
            for t, kept in zip(stacks, saved):
                t.copy_(kept)
            self.capture_s += buffers.update.capture_s
        if not self._has_sliding_layers():
            before = self.target.graphs.capture_s
            self.target.capture([1], Phase.DRAFT, kv_selection=buffers.selection)
            self.capture_s += self.target.graphs.capture_s - before if self.target.graphs else 0.0

    def capture_seconds(self) -> float:
        return self.capture_s

    def after_verify(self, start: torch.Tensor, accepted: torch.Tensor) -> None:
        self.buffers.recent_src.copy_(start)  # the verify step's first slot: the new prefix end
        self.buffers.accepted_src.copy_(accepted)
        if self.buffers.update is not None:
            self.buffers.update()
        else:
            self._update()
        self._updated = True

    def on_verify(self, feedback: VerifyFeedback) -> None:
        if (
            self._updated
        ):  # a plain step skipped the update (`idle_at_k0`): the selection keeps its prefix end
            self._set_host_bounds([c - 1 for c in feedback.committed_before])
        self._updated = False

    # ------------------------------------------------------------------------------------------------ selection
    def _make_buffers(self, state: DecodeState) -> _Buffers:
        target = self.target
        capacity = target.cache.capacity
        devices = target.cache.layer_devices(target.device)
        batch = state.batch_size
        k_slots = min(capacity, budget(capacity, self.ratio, self.min_tokens))
        selection = self._make_selection(devices, batch, k_slots)
        collection = self._collection if self.collects_scores else None
        if collection is not None and self.selection != "last_token":
            # fixed score buffers over the whole cache (captured verify steps write into them)
            collection.fix_buffers({layer: ((batch, capacity), d) for layer, d in enumerate(devices)})
        zeros = torch.zeros(batch, dtype=torch.long, device=target.device)
        return _Buffers(selection, collection, zeros, zeros.clone())

    def _layer_scores(self, layers: list[int], capacity: int) -> torch.Tensor:
        """``[N, B, capacity]`` scores of ``layers`` (padded with -inf past what the step wrote)."""
        collection = self.buffers.collection
        block = collection.block(layers)
        if block is not None and block.shape[-1] == capacity:  # the fixed buffers: no copy
            return block
        rows = []
        for layer in layers:
            scores = collection.layer(layer)
            if scores.dim() == 3:  # per-row scores: the row of the last accepted token
                pick = self.buffers.accepted_src.to(scores.device).clamp_max(scores.shape[1] - 1)
                scores = scores[torch.arange(scores.shape[0], device=scores.device), pick]
            rows.append(scores)
        stacked = torch.stack(rows)  # eager steps: [N, B, kv_len]; captured: views of the fixed buffers
        if stacked.shape[-1] < capacity:
            stacked = torch.nn.functional.pad(stacked, (0, capacity - stacked.shape[-1]), value=float("-inf"))
        return stacked

    def _make_selection(self, devices: list[torch.device], batch: int, k_slots: int):
        return IndexSelection(devices, batch, k_slots)

    def _update(self) -> None:
        """The selection for the prefix ``[pad, recent_src)`` of every row, in every layer (device work only: one
        `_fill` per device, for all the layers on it)."""
        buffers = self.buffers
        for group, (layers, recent_stack) in enumerate(buffers.selection.recent.groups):
            device = recent_stack.device
            recent = buffers.recent_src.to(device)
            pad = self.target.pad_t.to(device)
            count = kept_counts((recent - pad).clamp_min(0), self.ratio, self.min_tokens)
            recent_stack.copy_(recent.expand_as(recent_stack))
            self._fill(group, layers, pad, recent, count)

    def _fill(
        self, group: int, layers: list[int], pad: torch.Tensor, recent: torch.Tensor, count: torch.Tensor
    ) -> None:
        """Write the selection of ``layers`` (the device group ``group`` of the selection's stacks): ``count[b]``
        prefix slots of ``[pad[b], recent[b])`` per row."""
        raise NotImplementedError

    def _set_host_bounds(self, ends: list[int]) -> None:
        """Host-side bound of the selection just made over prefixes ``[pad, ends)`` (eager gather backends slice
        the recent slots with it)."""
        self.buffers.selection.recent_min = min(ends)

    def _has_sliding_layers(self) -> bool:
        config = self.target.model.config.get_text_config()
        layer_types = getattr(config, "layer_types", None) or []
        return "sliding_attention" in layer_types or bool(
            getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
        )

    # ------------------------------------------------------------------------------------------------ drafting
    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        start = state.pending_slots()
        token = state.pending_tokens()[:, 0]
        top = state.max_pending()
        uniform = state.uniform()
        tokens, probs = [], []
        for i in range(num_tokens):
            logits = self.target.forward(
                token[:, None], start + i, Phase.DRAFT, kv_len=top + i + 1, uniform_start=uniform,
                kv_selection=self.buffers.selection,
            )[:, 0]  # fmt: skip
            token, prob = pick_tokens(logits, state)
            tokens.append(token)
            probs.append(prob)
        counts = state.active_t.long() * num_tokens
        host_counts = [num_tokens if a else 0 for a in state.active]
        draft_probs = torch.stack(probs, dim=1) if state.do_sample else None
        return Draft(torch.stack(tokens, dim=1), counts, draft_probs, host_counts)

    def close(self) -> None:
        if self.target is not None:
            self.target.draft_weights = None
        self.target = None
        self.session = None


class VegasDrafter(SelfSpecDrafter):
    """Vegas: the top-scoring prefix tokens by the verify pass's own attention (max-pooled over ``pool``
    neighbouring slots), beside a recent window."""

    policy = "vegas"
    collects_scores = True
    needs_dense_verify_attention = True
    idle_at_k0 = True

    def _fill(self, group, layers, pad, recent, count) -> None:
        selection = self.buffers.selection
        selection.count.groups[group][1].copy_(count.expand_as(selection.count.groups[group][1]))
        scores = self._layer_scores(layers, self.target.cache.capacity)
        window = torch.round(count.double() * self.recent_share).long()
        selection.index.groups[group][1].copy_(
            topk_index(scores, pad, recent, count, selection.k_slots, window, self.pool)
        )


class StreamingDrafter(SelfSpecDrafter):
    """StreamingLLM: sink tokens and the most recent ones."""

    policy = "streaming"
    idle_at_k0 = True

    def _fill(self, group, layers, pad, recent, count) -> None:
        selection = self.buffers.selection
        counts, index = selection.count.groups[group][1], selection.index.groups[group][1]
        counts.copy_(count.expand_as(counts))
        index.copy_(streaming_index(pad, recent, count, self.sinks, selection.k_slots).expand_as(index))


class QuestDrafter(SelfSpecDrafter):
    """Quest: pages chosen per draft query from page summaries refreshed after every verify step."""

    policy = "quest"

    def _make_selection(self, devices, batch, k_slots):
        window = math.ceil((self.max_k + 1) / self.page_size) + 1  # pages one step's new tokens can touch
        return QuestSelection(devices, batch, self.page_size, math.ceil(k_slots / self.page_size), window)

    def _fill(self, group, layers, pad, recent, count) -> None:
        selection = self.buffers.selection
        pages = selection.pages.groups[group][1]
        size = self.page_size
        wanted = (count + size - 1) // size
        # a prefix within its budget keeps every page it overlaps (its ends need not be page-aligned)
        overlapping = (recent + size - 1) // size - pad // size
        dense = count >= (recent - pad).clamp_min(0)
        pages.copy_(torch.where(dense, overlapping, wanted).expand_as(pages))
        for layer in layers:
            selection.refresh(layer, self.target.cache.layers[layer].keys, pad)

    def _update(self) -> None:
        super()._update()
        self.buffers.selection.stale = False  # later updates (the captured one) refresh their window only

    def prefill(self, state: DecodeState) -> None:
        if self.buffers is not None:
            self.buffers.selection.stale = True  # a new call's prompt: summarise every page once
        super().prefill(state)
