"""``draft_model``: a smaller model with the same vocabulary drafts K tokens autoregressively.

The draft model keeps its own `SpecCache`. Before drafting it catches up on the history it has not seen (the
tokens the last verify step accepted, or everything decoded during plain-decode phases), in chunks of at most
``max_k + 1`` tokens per forward; rows needing fewer tokens read stale slots past their history, whose keys land
beyond the row's valid length and are overwritten later. After verification the draft cache rolls back to the
longest prefix that matches the new history (a length change, no copy).
"""

from __future__ import annotations

import functools

import torch

from ...step import Phase
from ..engine.runner import ModelRunner
from ..engine.state import DecodeState, to_device
from .base import Draft, Drafter, VerifyFeedback
from .sampling import pick_tokens


@functools.lru_cache(maxsize=2)
def load_draft_model(name_or_path: str, dtype: torch.dtype, device: str):
    """Load (once per process, for the two most recent keys) a draft model named in the config."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype).to(device).eval()


class DraftModelDrafter(Drafter):
    """Drafts with a separate (smaller) causal LM sharing the target's vocabulary."""

    takes_draft_model = True
    own_model = True

    def __init__(self, model, target_vocab_size: int | None = None, max_k: int = 16):
        draft_vocab = model.get_output_embeddings().weight.shape[0]
        if target_vocab_size is not None and draft_vocab != target_vocab_size:
            raise ValueError(
                f"the draft model's vocabulary has {draft_vocab} entries but the target's has {target_vocab_size}: "
                "a draft model must share the target's tokenizer and vocabulary size"
            )
        self.model = model.eval()
        self.max_k = max_k
        self.runner: ModelRunner | None = None
        self.cached: list[int] = []
        self.target: ModelRunner | None = None
        self.session = None
        self.capture_s = 0.0

    @classmethod
    def from_config(cls, config, target, draft_model=None) -> DraftModelDrafter:
        if draft_model is None:
            if config.draft_model is None:
                raise ValueError(
                    "strategy 'draft_model' needs a draft model: set SpeculationConfig(draft_model='folder or Hub "
                    "id') or pass generate(..., draft_model=loaded_model)"
                )
            draft_model = load_draft_model(config.draft_model, target.dtype, str(target.device))
        target_vocab = target.get_output_embeddings().weight.shape[0]
        return cls(draft_model, target_vocab, config.max_draft_tokens)

    @property
    def models(self) -> tuple:  # type: ignore[override]
        return (self.model,)

    def session_key(self) -> tuple:
        return ("draft_model", id(self.model), self.max_k)

    def attach(self, target, state: DecodeState, session) -> None:
        self.target = target
        self.session = session
        self.capture_s = 0.0

    def prefill(self, state: DecodeState) -> None:
        batch, prompt_len = state.batch_size, state.prompt_len
        kept = self.session.drafter_state if self.session is not None else None
        if kept is None or kept.model is not self.model:
            capacity = max(self.target.cache.capacity, state.tokens.shape[1]) + self.max_k + 2
            kept = ModelRunner(self.model, batch, capacity, state.device, self.target.backend)
            if self.session is not None:
                self.session.drafter_state = kept
        self.runner = kept
        self.runner.set_padding(state.pad)
        # the prompt; _catch_up feeds the rest (the first generated token onwards)
        self.runner.prefill(state.tokens[:, :prompt_len])
        self.cached = [prompt_len] * batch

    def kept_graphs(self) -> bool:
        """Whether this call's session already holds the draft model's captured steps (from an earlier call)."""
        kept = self.session.drafter_state if self.session is not None else None
        return kept is not None and kept.model is self.model and kept.graphs is not None

    def capture(self, widths) -> None:
        # draft steps (width 1) and catch-up chunks (up to max_k + 1); kept captures are reused
        before = self.runner.graphs.capture_s if self.runner.graphs else 0.0
        self.runner.capture(range(1, self.max_k + 2))
        self.capture_s = (self.runner.graphs.capture_s if self.runner.graphs else 0.0) - before

    def capture_seconds(self) -> float:
        return self.capture_s

    def _catch_up(self, state: DecodeState) -> torch.Tensor:
        """Feed every row's unseen history; return ``[B, V]`` logits for the token after each row's history."""
        committed = state.committed
        chunk = self.max_k + 1
        last_logits = None
        done = [not a for a in state.active]
        capacity = state.tokens.shape[1]
        while not all(done):
            start = [committed[b] - 1 if done[b] else self.cached[b] for b in range(state.batch_size)]
            width = min(chunk, max(committed[b] - start[b] for b in range(state.batch_size)))
            start_t = to_device(start, state.device)
            slots = start_t[:, None] + torch.arange(width, device=state.device)
            input_ids = state.tokens.gather(1, slots.clamp_max(capacity - 1))
            logits = self.runner.forward(
                input_ids, start_t, Phase.DRAFT, kv_len=max(start) + width, uniform_start=len(set(start)) == 1
            )  # [B, W, V]
            finishing = []
            for b in range(state.batch_size):
                if done[b]:
                    continue
                self.cached[b] = min(start[b] + width, committed[b])
                if self.cached[b] == committed[b]:
                    done[b] = True
                    finishing.append((b, committed[b] - 1 - start[b]))
            rows = to_device([b for b, _ in finishing], logits.device)
            cols = to_device([i for _, i in finishing], logits.device)
            if last_logits is None:
                last_logits = logits.new_zeros(logits.shape[0], logits.shape[-1])
            last_logits[rows] = logits[rows, cols]
        return last_logits

    # ---------------------------------------------------------------------------------------------- interface
    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        token, prob = pick_tokens(self._catch_up(state), state)
        tokens, probs = [token], [prob]
        start = state.committed_t - 1
        top, uniform = state.max_pending(), state.uniform()
        for i in range(1, num_tokens):
            logits = self.runner.forward(
                token[:, None], start + i, Phase.DRAFT, kv_len=top + i + 1, uniform_start=uniform
            )[:, 0]
            token, prob = pick_tokens(logits, state)
            tokens.append(token)
            probs.append(prob)
        self.cached = [c + num_tokens - 1 for c in state.committed]
        host_counts = [num_tokens if a else 0 for a in state.active]
        draft_probs = torch.stack(probs, dim=1) if state.do_sample else None
        return Draft(torch.stack(tokens, dim=1), state.active_t.long() * num_tokens, draft_probs, host_counts)

    def on_verify(self, feedback: VerifyFeedback) -> None:
        for b, accepted in enumerate(feedback.accepted):
            if accepted is None:  # finished row: keep the bookkeeping consistent, it is never fed again
                self.cached[b] = min(self.cached[b], feedback.committed_after[b] - 1)
            else:
                self.cached[b] = min(self.cached[b], feedback.committed_before[b] + accepted)

    def close(self) -> None:
        self.runner = None
        self.target = None
        self.session = None
