"""The speculative decoding loop: prefill, then per step draft K tokens, verify them in one target forward,
accept, roll back, stop. Batched over left-padded rows that each accept a different number of tokens.

One host readback per step (accepted counts and the emitted tokens); everything else stays on the device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..moe.experts import experts_for_decoding
from .drafters.base import Draft, Drafter, VerifyFeedback
from .graphs import warn_once
from .k_policy import KPolicy, StepOutcome
from .processing import StopChecker, process_window
from .runner import ModelRunner
from .state import DecodeState
from .stats import SpeculationStats
from .timing import StepTimer
from .verify import verify_greedy, verify_sampling_without_probs, verify_speculative_sampling


@dataclass
class LoopSettings:
    """Per-call settings of `speculative_decode` (derived from the generation config)."""

    max_length: int
    max_draft_tokens: int
    do_sample: bool
    pad_token_id: int
    backend: str = "reference"
    cache_len: int | None = None  # KV slots per row; default max_length + max_draft_tokens
    cuda_graphs: bool | None = False  # None: where possible; True: asked for (warn once where impossible)


def left_padding(attention_mask: torch.Tensor | None, batch: int, width: int) -> list[int]:
    """Left padding per row from a ``[B, T]`` 0/1 mask; raises on right padding or holes."""
    if attention_mask is None:
        return [0] * batch
    mask = attention_mask.to("cpu", torch.int64)
    if mask.shape != (batch, width):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, expected {(batch, width)}")
    pads = (width - mask.sum(dim=1)).tolist()
    expected = torch.arange(width)[None, :] >= torch.tensor(pads)[:, None]
    if not torch.equal(mask.bool(), expected):
        raise ValueError(
            "attention_mask must be left padding only (zeros then ones in every row): right padding or holes "
            "are not supported; tokenize with padding_side='left'"
        )
    if max(pads) >= width:
        raise ValueError("a row of the batch is empty (all padding): give every row at least one token")
    return pads


def _select(
    scores: torch.Tensor, draft: Draft, counts: torch.Tensor, do_sample: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if not do_sample:
        return verify_greedy(draft.tokens, counts, scores)
    if draft.probs is not None:
        return verify_speculative_sampling(draft.tokens, counts, draft.probs, scores)
    return verify_sampling_without_probs(draft.tokens, counts, scores)


def _empty_draft(batch: int, device: torch.device) -> Draft:
    return Draft(torch.zeros(batch, 0, dtype=torch.long, device=device), [0] * batch, None)


def _truncate(draft: Draft, k: int) -> Draft:
    probs = draft.probs[:, :k] if draft.probs is not None else None
    return Draft(draft.tokens[:, :k], [min(c, k) for c in draft.counts], probs)


class _Emitter:
    """Streams finished columns exactly as plain generation would: column t once every active row has t + 1
    new tokens, with padding for rows that already stopped."""

    def __init__(self, streamer, state: DecodeState, pad_token_id: int):
        self.streamer = streamer
        self.state = state
        self.pad = pad_token_id
        self.sent = 0

    def flush(self, final: bool = False) -> None:
        if self.streamer is None:
            return
        state = self.state
        generated = [c - state.prompt_len for c in state.committed]
        live = [g for g, a in zip(generated, state.active) if a]
        ready = max(generated) if (final or not live) else min(live)
        for t in range(self.sent, ready):
            column = [
                int(state.host_tokens[b, state.prompt_len + t]) if t < generated[b] else self.pad
                for b in range(state.batch_size)
            ]
            self.streamer.put(torch.tensor(column))
        self.sent = max(self.sent, ready)
        if final:
            self.streamer.end()


def speculative_decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    drafter: Drafter,
    policy: KPolicy,
    processors,
    stopping_criteria,
    eos_token_ids: list[int],
    settings: LoopSettings,
    streamer=None,
    stats: SpeculationStats | None = None,
) -> tuple[torch.Tensor, SpeculationStats]:
    """Generate with speculative decoding; returns ``[B, T]`` sequences (prompt included, finished rows padded)
    and the call's `SpeculationStats`.

    ``model`` must already use the ``"sparse_verify"`` attention (see `use_sparse_verify_attention`).
    """
    wall_start = time.perf_counter()
    stats = stats or SpeculationStats()
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    pads = left_padding(attention_mask, batch, prompt_len)
    max_k = settings.max_draft_tokens
    capacity = settings.max_length + max_k + 1

    tokens = torch.full((batch, capacity), settings.pad_token_id, dtype=torch.long, device=device)
    tokens[:, :prompt_len] = input_ids
    host_tokens = tokens.cpu()
    state = DecodeState(
        tokens=tokens,
        host_tokens=host_tokens,
        pad=pads,
        pad_t=torch.tensor(pads, device=device),
        committed=[prompt_len] * batch,
        active=[True] * batch,
        prompt_len=prompt_len,
        do_sample=settings.do_sample,
        processors=processors,
    )
    stop = StopChecker(stopping_criteria, settings.max_length, eos_token_ids)
    emitter = _Emitter(streamer, state, settings.pad_token_id)
    cache_len = settings.cache_len or settings.max_length + max_k
    target = ModelRunner(model, batch, cache_len, pads, device, settings.backend)
    target.use_graphs = settings.cuda_graphs is not False and target.can_capture()
    if settings.cuda_graphs is True and not target.use_graphs:
        warn_once(
            "cuda_graphs_unavailable",
            f"hf_sparse_verify: cuda_graphs=True, but CUDA graphs need a CUDA model and the 'triton' attention "
            f"backend (here: {target.device.type}, {target.backend!r}); running eager steps.",
        )
    drafter.attach(target)

    def emit(accepted: torch.Tensor, new_tokens: torch.Tensor) -> tuple[list[int | None], list[int]]:
        """Write the step's tokens and apply stopping; returns the drafts per row that entered the history and
        the history lengths before the step."""
        before = list(state.committed)
        readback = torch.cat([accepted[:, None], new_tokens], dim=1).cpu()  # the step's one readback
        state.write(before, new_tokens, readback[:, 1:])
        accepted_rows: list[int | None] = [None] * batch
        for b in range(batch):
            if not state.active[b]:
                continue
            m = int(readback[b, 0])
            kept, finished = stop.keep(tokens, b, before[b], readback[b, 1 : m + 2].tolist())
            accepted_rows[b] = min(m, kept)
            state.committed[b] = before[b] + kept
            state.active[b] = not finished
        return accepted_rows, before

    # ------------------------------------------------------------------------------------------------ prefill
    timer = StepTimer(device)
    timer.mark("prefill_start")
    logits = target.forward(
        input_ids, [0] * batch, "prefill", layer_states=drafter.layer_states("prefill"), logits_to_keep=1
    )  # [B, 1, V]
    scores = processors(tokens[:, :prompt_len], logits[:, 0])[:, None] if len(processors) else logits
    first = _empty_draft(batch, device)
    accepted, new_tokens = _select(
        scores, first, torch.zeros(batch, dtype=torch.long, device=device), settings.do_sample
    )
    timer.mark("prefill_end")
    emit(accepted, new_tokens)
    stats.prefill_time_s = timer.seconds("prefill_start", "prefill_end")
    emitter.flush()
    drafter.prefill(state)

    # --------------------------------------------------------------------------------------------------- steps
    with experts_for_decoding(model, *getattr(drafter, "models", [])):
        if target.use_graphs:
            # one graph per verify width 1 .. K_max + 1 (captured with the decoding experts implementation); the
            # policy may then change K at every step without a recapture
            widths = range(1, min(policy.k_bound, max_k) + 2)
            if not drafter.needs_verify_states:
                target.capture(widths)
            elif drafter.verify_graphable:
                target.capture(widths, "verify", drafter.layer_states("verify"))
            drafter.capture_graphs()
        stats.graph_capture_s = sum(r.graphs.capture_s for r in (target, *drafter.runners) if r.graphs)
        while any(state.active):
            remaining = max(settings.max_length - c for c, a in zip(state.committed, state.active) if a)
            k = max(0, min(policy.next_k(), max_k, remaining - 1))
            timer.mark("draft_start")
            draft = drafter.get_candidates(state, k) if k > 0 else _empty_draft(batch, device)
            k = max((c for c, a in zip(draft.counts, state.active) if a), default=0)
            draft = _truncate(draft, k)
            timer.mark("verify_start")
            pending = tokens.gather(1, torch.tensor(state.committed, device=device)[:, None] - 1)
            ids = torch.cat([pending, draft.tokens], dim=1)  # [B, K+1]
            start = [c - 1 for c in state.committed]
            logits = target.forward(ids, start, "verify", layer_states=drafter.layer_states("verify"))
            scores = process_window(processors, tokens, state.committed, state.active, draft.tokens, logits)
            counts = torch.tensor(draft.counts, device=device)
            accepted, new_tokens = _select(scores, draft, counts, settings.do_sample)
            timer.mark("verify_end")
            active_before = list(state.active)
            accepted_rows, before = emit(accepted, new_tokens)
            drafter.on_verify(VerifyFeedback(before, accepted_rows, list(state.committed)))
            timer.mark("step_end")

            draft_s = timer.seconds("draft_start", "verify_start")
            verify_s = timer.seconds("verify_start", "verify_end")
            update_s = timer.seconds("verify_end", "step_end")
            index = stats.steps
            stats.steps += 1
            stats.draft_tokens.append(k)
            stats.accepted_tokens.append([a if act else None for a, act in zip(accepted_rows, active_before)])
            stats.step_times_s.append(draft_s + verify_s + update_s)
            stats.draft_time_s += draft_s
            stats.verify_time_s += verify_s
            stats.update_time_s += update_s
            policy.observe(
                StepOutcome(
                    index,
                    k,
                    [a for a, act in zip(accepted_rows, active_before) if act],
                    draft_s + verify_s + update_s,
                )
            )
            policy_state = policy.state()
            if policy_state:
                stats.policy_states.append(policy_state)
            emitter.flush()

    emitter.flush(final=True)
    drafter.close()
    generated = [c - prompt_len for c in state.committed]
    width = prompt_len + max(generated)
    keep = torch.arange(width, device=device)[None, :] < torch.tensor(state.committed, device=device)[:, None]
    sequences = torch.where(
        keep, tokens[:, :width], torch.full_like(tokens[:, :width], settings.pad_token_id)
    )
    stats.new_tokens = generated
    stats.wall_time_s = time.perf_counter() - wall_start
    return sequences, stats
