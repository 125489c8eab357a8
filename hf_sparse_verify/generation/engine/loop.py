"""The speculative decoding loop: prefill, then per step draft K tokens, verify them in one target forward,
accept, roll back, stop. Batched over left-padded rows that each accept a different number of tokens.

One host readback per step: the accepted counts, the drafts proposed and the emitted tokens, read together.
Row lengths and positions live on the device (`DecodeState`) and advance there; the host mirrors follow from
the readback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..._logging import warn_once
from ...integrations import Switched
from ...placement import RankAgreement
from ...sparse.state import SparseVerifyState
from ...step import Phase
from ..drafters.base import Draft, Drafter, VerifyFeedback, empty_draft
from ..policies.k_policy import KPolicy, StepOutcome
from ..verification.processing import StopChecker, process_window
from ..verification.verify import verify_greedy, verify_sampling_without_probs, verify_speculative_sampling
from .emitter import Emitter
from .runner import ModelRunner
from .sessions import SESSIONS, capacity_bucket
from .state import DecodeState
from .stats import SpeculationStats
from .timing import StepTimer


@dataclass
class LoopSettings:
    """Per-call settings of `speculative_decode` (derived from the generation config)."""

    max_length: int
    max_draft_tokens: int
    do_sample: bool
    pad_token_id: int
    backend: str = "reference"
    cache_len: int | None = None  # KV slots per row; default max_length + max_draft_tokens
    fixed_cache_len: bool = False  # cache_len was asked for (max_cache_len): no capacity bucket
    cuda_graphs: bool | None = False  # None: where possible; True: asked for (warn once where impossible)
    sparse: object | None = None  # LossySparseVerify: lossy sparse verification (None: dense)
    calibration: object | None = None  # its SparseCalibration


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


def _observe(policy, stats, outcome, agreed) -> None:
    """Hands a step's outcome to the policy, with its (draft, verify, update) seconds as agreed over the ranks."""
    begin = time.perf_counter()
    parts = agreed.values()
    outcome.time_s = sum(parts)
    outcome.extra["parts"] = parts
    policy.observe(outcome)
    policy_state = policy.state()
    stats.policy_time_s += time.perf_counter() - begin
    if policy_state:
        stats.policy_states.append(policy_state)


def _select(scores: torch.Tensor, draft: Draft, do_sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not do_sample:
        return verify_greedy(draft.tokens, draft.counts, scores)
    if draft.probs is not None:
        return verify_speculative_sampling(draft.tokens, draft.counts, draft.probs, scores)
    return verify_sampling_without_probs(draft.tokens, draft.counts, scores)


def _trim(draft: Draft, active: list[bool]) -> Draft:
    """Cut K to the longest draft of an active row when the counts are known on the host."""
    if draft.host_counts is None:
        return draft
    k = max((c for c, a in zip(draft.host_counts, active) if a), default=0)
    probs = draft.probs[:, :k] if draft.probs is not None else None
    return Draft(
        draft.tokens[:, :k], draft.counts.clamp_max(k), probs, [min(c, k) for c in draft.host_counts]
    )


def _target_runner(
    model, drafter: Drafter, batch: int, settings: LoopSettings, device
) -> tuple[ModelRunner, object]:
    """The target's runner: from the session cache when steps run on CUDA graphs, else a fresh one."""
    needed = settings.cache_len or settings.max_length + settings.max_draft_tokens
    fresh = ModelRunner(model, batch, needed, device, settings.backend)
    graphs = settings.cuda_graphs is not False and fresh.can_capture()
    if settings.cuda_graphs is not False and fresh.graph_obstacle is not None:
        name = type(model).__name__
        warn_once(
            f"placement:{name}",
            f"hf_sparse_verify: {name} {fresh.graph_obstacle}; its steps run eagerly, without CUDA graphs "
            "(slower per step, same output). Set SpeculationConfig(cuda_graphs=False) to silence this.",
        )
    elif settings.cuda_graphs is True and not graphs:
        warn_once(
            "cuda_graphs_unavailable",
            f"hf_sparse_verify: cuda_graphs=True, but CUDA graphs need a CUDA model and the 'triton' attention "
            f"backend (here: {fresh.device.type}, {fresh.backend!r}); running eager steps.",
        )
    if not graphs:
        return fresh, None
    capacity = needed if settings.fixed_cache_len else capacity_bucket(needed)
    weight = model.get_input_embeddings().weight
    key = (id(model), weight.dtype, str(weight.device), batch, capacity, settings.backend,
           settings.max_draft_tokens, drafter.session_key(), settings.sparse, id(settings.calibration))  # fmt: skip
    session = SESSIONS.get(key, model, lambda: ModelRunner(model, batch, capacity, device, settings.backend))
    session.target.use_graphs = True
    return session.target, session


def _verify_sparsity(model, target: ModelRunner, session, settings: LoopSettings, prompt_len: int):
    """The lossy sparse-verification slot (None for dense verification): the session's (its tensors are what the
    captured verify graphs read) or a new one; its block summaries are rebuilt from this call's prefill."""
    if settings.sparse is None:
        return None
    sparsity = session.sparse_state if session is not None else None
    if sparsity is None:
        layers = model.config.get_text_config().num_hidden_layers
        devices = target.cache.layer_devices(target.device)
        sparsity = SparseVerifyState(settings.sparse, layers, settings.calibration, devices)
        if session is not None:
            session.sparse_state = sparsity
    length = torch.full_like(target.pad_t, prompt_len)
    sparsity.prefill(target.cache, target.pad_t, length)
    return sparsity


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
    switched: Switched,
) -> tuple[torch.Tensor, SpeculationStats]:
    """Generate with speculative decoding; returns ``[B, T]`` sequences (prompt included, finished rows padded)
    and the call's `SpeculationStats`.

    ``model`` and the drafter's models must be in hf_sparse_verify's mode: ``switched`` is what
    `hf_sparse_verify.integrations.speculation_mode` yielded for them (the steps enter its `decoding_experts`).
    """
    wall_start = time.perf_counter()
    stats = stats or SpeculationStats()
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    pads = left_padding(attention_mask, batch, prompt_len)
    max_k = settings.max_draft_tokens
    state = DecodeState.start(
        input_ids,
        pads,
        settings.max_length + max_k + 1,
        settings.pad_token_id,
        settings.do_sample,
        processors,
    )
    stop = StopChecker(stopping_criteria, settings.max_length, eos_token_ids)
    emitter = Emitter(streamer, state, settings.pad_token_id)
    target, session = _target_runner(model, drafter, batch, settings, device)
    target.set_padding(pads)
    drafter.attach(target, state, session)
    stats.draft_weights = drafter.low_bit_weights
    timer = StepTimer(device)
    agreement = RankAgreement(model)  # tensor-parallel ranks feed the policy equal step times

    def settle(accepted: torch.Tensor, new_tokens: torch.Tensor, counts: torch.Tensor):
        """The step's one readback, then stopping and the host mirrors."""
        readback = torch.cat([accepted[:, None], counts[:, None], new_tokens], dim=1).cpu()
        accepted_rows, before = state.settle(readback, stop)
        return accepted_rows, before, readback[:, 1].tolist()

    # ------------------------------------------------------------------------------------------------ prefill
    timer.mark("prefill_start")
    logits = target.prefill(input_ids, **drafter.step_slots(Phase.PREFILL))  # [B, 1, V]
    scores = processors(state.tokens[:, :prompt_len], logits[:, 0])[:, None] if len(processors) else logits
    first = empty_draft(batch, device)
    accepted, new_tokens = _select(scores, first, settings.do_sample)
    state.advance(accepted, new_tokens)
    settle(accepted, new_tokens, first.counts)
    emitter.flush()
    drafter.prefill(state)  # a draft model's own prefill counts as prefill
    timer.mark("prefill_end")
    sparsity = _verify_sparsity(model, target, session, settings, prompt_len)
    verify_sets = [{**slots, "verify_sparsity": sparsity} for slots in drafter.capture_slot_sets()]
    plain_slots = {"verify_sparsity": sparsity} if drafter.idle_at_k0 else verify_sets[0]  # K = 0 steps
    stats.prefill_time_s = timer.seconds("prefill_start", "prefill_end")
    policy.begin(agreement.seconds(stats.prefill_time_s)[0])

    # --------------------------------------------------------------------------------------------------- steps
    with switched.decoding_experts():
        if target.use_graphs:
            # one graph per verify width 1 .. max_draft_tokens + 1, whatever this call's policy needs: the session
            # keeps them, so a later call with another K or policy captures nothing
            before_s = target.graphs.capture_s if target.graphs else 0.0
            widths = range(1, max_k + 2)
            captured = all(target.capture(widths, Phase.VERIFY, **slots) for slots in verify_sets)
            if captured and target.capture([1], Phase.VERIFY, **plain_slots):
                drafter.capture(widths)
            stats.graph_capture_s = (target.graphs.capture_s if target.graphs else 0.0) - before_s
        loop_start = step_end = time.perf_counter()
        deferred = None  # under tensor parallelism: (outcome, agreed times) of the last step
        while any(state.active):
            remaining = max(settings.max_length - c for c, a in zip(state.committed, state.active) if a)
            policy_start = time.perf_counter()
            member, k = policy.next_step(remaining)
            stats.policy_time_s += time.perf_counter() - policy_start
            k = max(0, min(k, max_k, remaining - 1))
            drafter.choose(member if k > 0 else None, state)
            issued = k
            timer.mark("draft_start")
            if stats.steps:
                stats.between_steps_s += time.perf_counter() - step_end
            draft = drafter.get_candidates(state, k) if k > 0 else empty_draft(batch, device)
            draft = _trim(draft, state.active)
            k = draft.tokens.shape[1]
            timer.mark("verify_start")
            start = state.pending_slots()
            ids = torch.cat([state.pending_tokens(), draft.tokens], dim=1)  # [B, K+1]
            slots = (
                {**drafter.step_slots(Phase.VERIFY), "verify_sparsity": sparsity} if k > 0 else plain_slots
            )
            if sparsity is not None and k > 0:
                sparsity.drafted(draft.counts)  # which verify tokens are filler after a short draft
            logits = target.forward(
                ids, start, Phase.VERIFY, kv_len=state.max_pending() + k + 1, uniform_start=state.uniform(),
                **slots,
            )  # fmt: skip
            scores = process_window(
                processors, state.tokens, state.committed, state.active, draft.tokens, logits
            )
            accepted, new_tokens = _select(scores, draft, settings.do_sample)
            timer.mark("verify_end")
            state.advance(accepted, new_tokens)
            if k > 0 or not drafter.idle_at_k0:
                drafter.after_verify(start, accepted)
            if deferred is not None:  # the last step's outcome, its times agreed over the ranks meanwhile
                _observe(policy, stats, *deferred)
                deferred = None
            policy_start = time.perf_counter()
            policy.prepare()  # the host would wait for the verify in the readback below
            stats.policy_time_s += time.perf_counter() - policy_start
            active_before = list(state.active)
            accepted_rows, before, proposed = settle(accepted, new_tokens, draft.counts)
            drafter.on_verify(VerifyFeedback(before, accepted_rows, list(state.committed)))
            timer.mark("step_end")
            step_end = time.perf_counter()

            draft_s = timer.seconds("draft_start", "verify_start")
            verify_s = timer.seconds("verify_start", "verify_end")
            update_s = timer.seconds("verify_end", "step_end")
            ran = member if issued > 0 else None
            stats.record_step(k, accepted_rows, active_before, proposed, draft_s, verify_s, update_s, ran)
            agreed = agreement.start(draft_s, verify_s, update_s)  # equal on every tensor-parallel rank
            outcome = StepOutcome(
                stats.steps - 1,
                k,
                [a for a, act in zip(accepted_rows, active_before) if act],
                None,
                extra={
                    "member": ran,
                    "issued": issued,
                    "shadow": drafter.take_shadow(),
                    "rows": accepted_rows,
                    "active": list(state.active),
                    "remaining": [settings.max_length - c for c in state.committed],
                },
                drafted=[n for n, act in zip(proposed, active_before) if act],
            )
            if agreed.pending:
                deferred = (outcome, agreed)  # handed over at the next step, once its verify is launched
            else:
                _observe(policy, stats, outcome, agreed)
            emitter.flush()
        if deferred is not None:
            _observe(policy, stats, *deferred)
        policy.finish()
        stats.policy_states.extend(policy.late_reports())
        stats.loop_time_s = time.perf_counter() - loop_start

    emitter.flush(final=True)
    stats.graph_capture_s += drafter.capture_seconds()
    stats.prefill_time_s += drafter.extra_prefill_seconds()
    drafter.close()
    generated = [c - prompt_len for c in state.committed]
    width = prompt_len + max(generated)
    keep = torch.arange(width)[None, :] < torch.tensor(state.committed)[:, None]
    sequences = torch.where(keep, state.host_tokens[:, :width], settings.pad_token_id).to(device)
    stats.new_tokens = generated
    stats.wall_time_s = time.perf_counter() - wall_start
    return sequences, stats
