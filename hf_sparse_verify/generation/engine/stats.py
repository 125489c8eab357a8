"""`SpeculationStats`: what a speculative `generate` call did, step by step."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpeculationStats:
    """Per-call statistics, returned as ``output.speculation`` with ``return_dict_in_generate=True``.

    Attributes:
        strategy / k_policy: what ran.
        steps: target forwards after the prefill (drafting steps and plain decode steps).
        draft_tokens: K at each step (0 for a plain decode step).
        accepted_tokens: per step, per row, drafts accepted (bonus excluded); None for rows already finished.
        new_tokens: tokens generated per row (EOS included, padding excluded).
        policy_states: per step, what the K policy reported (phase, utilities, ...), when it reports anything.
        step_times_s: per step, draft + verify + update time in seconds.
        wall_time_s / prefill_time_s / draft_time_s / verify_time_s / update_time_s: seconds; draft, verify and
            update are summed over steps (CUDA events on GPU, host timers on CPU). ``update`` is the work after
            verification: the step's readback, stopping checks and the drafter's update (Vegas' KV selection).
        graph_capture_s: seconds this call spent capturing CUDA graphs (0 when steps run eagerly, and when the
            graphs came from a session kept by an earlier call).
        proposed_tokens: per step, per row, drafts the drafter proposed (``<= K``; None for finished rows).
        step_parts_s: per step, (draft, verify, update) seconds.
        loop_time_s: host seconds of the step loop (every step, from the first draft to the last flush); the rest
            of ``wall - prefill - capture`` is set-up and finish (runner lookup, graph checks, the output).
        between_steps_s: host seconds between one step's end and the next one's draft (the K policy's choice,
            the drafter's switch, the statistics): time the device waits on the host.
        policy_time_s: the part of it spent in the K policy (``next_step`` and ``observe``).
        draft_weights: the format of the target's low-bit copy the drafter drafts with (``"int8"`` / ``"int4"``:
            Vegas / Streaming / Quest with ``draft_weights``, the ``low_bit`` strategy; under ``auto`` the copy its
            low-bit members hold), or None: the model's own weights or a separate draft model. With
            ``draft_weights="auto"`` it says what the call's rows resolved to.
        members: per step, the drafter that drafted (``strategy="auto"`` names its member; a named strategy's
            drafting steps carry the strategy; None for plain steps).
    """

    strategy: str = ""
    k_policy: str = ""
    steps: int = 0
    draft_tokens: list[int] = field(default_factory=list)
    accepted_tokens: list[list[int | None]] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    policy_states: list[dict] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0
    graph_capture_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    update_time_s: float = 0.0
    proposed_tokens: list[list[int | None]] = field(default_factory=list)
    step_parts_s: list[tuple[float, float, float]] = field(default_factory=list)
    members: list[str | None] = field(default_factory=list)
    draft_weights: str | None = None
    loop_time_s: float = 0.0
    between_steps_s: float = 0.0
    policy_time_s: float = 0.0

    def record_step(
        self,
        k: int,
        accepted: list[int | None],
        active_before: list[bool],
        proposed: list[int],
        draft_s: float,
        verify_s: float,
        update_s: float,
        member: str | None = None,
    ) -> None:
        """Add one step (``accepted``/``proposed`` per row; rows inactive before the step are recorded as None;
        ``member``: the drafter that drafted, None for a plain step)."""
        self.steps += 1
        self.members.append(member)
        self.draft_tokens.append(k)
        self.accepted_tokens.append([a if act else None for a, act in zip(accepted, active_before)])
        self.proposed_tokens.append([int(p) if act else None for p, act in zip(proposed, active_before)])
        self.step_times_s.append(draft_s + verify_s + update_s)
        self.step_parts_s.append((draft_s, verify_s, update_s))
        self.draft_time_s += draft_s
        self.verify_time_s += verify_s
        self.update_time_s += update_s

    def _drafts(self):
        """(K, accepted) for every row of every drafting step."""
        for k, row_counts in zip(self.draft_tokens, self.accepted_tokens):
            if k == 0:
                continue
            for a in row_counts:
                if a is not None:
                    yield k, a

    @property
    def num_drafts(self) -> int:
        """Row-level drafting events (one per active row per step with K > 0)."""
        return sum(1 for _ in self._drafts())

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted drafts / drafting events, as vLLM defines it (1.0 when nothing was drafted)."""
        drafts = list(self._drafts())
        if not drafts:
            return 1.0
        return 1.0 + sum(a for _, a in drafts) / len(drafts)

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """For draft position i: accepted at i / drafts that reached position i."""
        proposed: list[int] = []
        accepted: list[int] = []
        for k, a in self._drafts():
            while len(proposed) < k:
                proposed.append(0)
                accepted.append(0)
            for i in range(k):
                proposed[i] += 1
                accepted[i] += int(a > i)
        return [acc / prop if prop else 0.0 for acc, prop in zip(accepted, proposed)]

    @property
    def chosen(self) -> dict[str, dict[str, float]]:
        """Per drafter that ran (``"k0"`` for plain steps): its share of the steps and its mean K.

        Example:
            >>> s = SpeculationStats(steps=4, draft_tokens=[0, 4, 4, 2], members=[None, "a", "a", "b"])
            >>> s.chosen
            {'k0': {'share': 0.25, 'mean_k': 0.0}, 'a': {'share': 0.5, 'mean_k': 4.0}, 'b': {'share': 0.25, 'mean_k': 2.0}}
        """
        names = (
            self.members if len(self.members) == len(self.draft_tokens) else [None] * len(self.draft_tokens)
        )
        out: dict[str, list[int]] = {}
        for name, k in zip(names, self.draft_tokens):
            out.setdefault(name or ("k0" if k == 0 else self.strategy), []).append(k)
        total = max(1, len(self.draft_tokens))
        return {name: {"share": len(ks) / total, "mean_k": sum(ks) / len(ks)} for name, ks in out.items()}

    @property
    def total_new_tokens(self) -> int:
        return sum(self.new_tokens)

    @property
    def tokens_per_second(self) -> float:
        return self.total_new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            mean_acceptance_length=self.mean_acceptance_length,
            acceptance_rate_per_position=self.acceptance_rate_per_position,
            total_new_tokens=self.total_new_tokens,
            chosen=self.chosen,
            tokens_per_second=self.tokens_per_second,
        )
        return d

    def summary(self) -> str:
        """A few human-readable lines (what the CLI prints with ``--stats``)."""
        rates = ", ".join(f"{r:.2f}" for r in self.acceptance_rate_per_position)
        chosen = ", ".join(
            f"{name} {c['share']:.0%} of steps (mean K {c['mean_k']:.1f})" for name, c in self.chosen.items()
        )
        why: dict[str, int] = {}
        for state in self.policy_states:
            if "reason" in state:
                why[state["reason"]] = why.get(state["reason"], 0) + 1
        lines = [f"ran: {chosen}"]
        if self.draft_weights is not None:
            lines.append(f"drafts on the model's {self.draft_weights} copy")
        if why:
            lines.append("why (planner, steps): " + ", ".join(f"{r} {n}" for r, n in why.items()))
        return "\n".join(
            [
                f"strategy={self.strategy} k_policy={self.k_policy}",
                f"steps={self.steps} new_tokens={self.new_tokens} (total {self.total_new_tokens})",
                f"mean_acceptance_length={self.mean_acceptance_length:.3f}",
                f"acceptance_rate_per_position=[{rates}]",
                f"draft_tokens per step: mean {sum(self.draft_tokens) / max(1, len(self.draft_tokens)):.2f}",
                f"wall_time_s={self.wall_time_s:.3f} prefill_time_s={self.prefill_time_s:.3f} "
                f"draft_time_s={self.draft_time_s:.3f} verify_time_s={self.verify_time_s:.3f} "
                f"update_time_s={self.update_time_s:.3f} "
                f"tokens/s={self.tokens_per_second:.1f}",
                *lines,
            ]
        )
