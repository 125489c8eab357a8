"""``strategy="auto"``: the planner's choices on simulated drafters (which drafter, which K, when to stay plain, how
it follows a change of text, what it carries to the next call), and the engine under it: greedy output equal to
plain ``generate`` (float32), sampling from the target's distribution with drafter switches inside one call, the
draft model started lazily."""

from __future__ import annotations

import gc
import importlib
import json
import time

import numpy as np
import pytest
import torch
from conftest import make_model, noisy_copy, ragged_batch
from test_verify import E2E_PROMPT, E2E_ROWS, _joint_next_tokens, _joint_pvalue, e2e_pair

import hf_sparse_verify as hsv
from hf_sparse_verify.generation.drafters.portfolio import PortfolioDrafter
from hf_sparse_verify.generation.policies import planner as planner_module
from hf_sparse_verify.generation.policies import remote as remote_module
from hf_sparse_verify.generation.policies.k_policy import KPolicy, StepOutcome
from hf_sparse_verify.generation.policies.planner import K0, CostProfile, Member, Planner

generate_module = importlib.import_module("hf_sparse_verify.generation.generate")

# ------------------------------------------------------------------------------------------------ simulated calls
PLAIN_S = 1.0e-3  # a plain step


def _parts(member: str | None, k: int) -> tuple[float, float, float]:
    """A step's (draft, verify, update) seconds: verify grows 5% per token; drafting costs 10% of a plain step
    per token for ``dm`` (a draft model), 5% flat for ``pl`` (a search)."""
    verify = 0.8 * PLAIN_S * (1 + 0.05 * k)
    draft = {"dm": 0.1 * PLAIN_S * k, "pl": 0.05 * PLAIN_S}.get(member, 0.02 * PLAIN_S * k) if k else 0.0
    return draft, verify, 0.2 * PLAIN_S


def _simulate(planner: Planner, steps: int, accepts, rows: int = 1, remaining: int = 10**6) -> list:
    """Run ``steps`` planned steps; ``accepts(member, k, i)`` gives each row's accepted drafts."""
    picks = []
    for i in range(steps):
        member, k = planner.next_step(remaining)
        picks.append((member or K0, k))
        accepted = [min(k, a) for a in accepts(member, k, i)] if member else [0] * rows
        parts = _parts(member, k)
        planner.observe(
            StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k, "parts": parts})
        )
    return picks


def _members(**starts) -> dict[str, Member]:
    return {name: Member(start_k=k, draft_grows_with_k=name != "pl") for name, k in starts.items()}


def _share(picks, name: str) -> float:
    return sum(m == name for m, _ in picks) / len(picks)


def test_picks_the_drafter_that_pays():
    planner = Planner(_members(pl=4, dm=4), max_k=8)
    picks = _simulate(planner, 300, lambda m, k, i: [3] if m == "dm" else [0])
    assert _share(picks[50:], "dm") > 0.95
    assert sum(m == "pl" for m, _ in picks) <= 8  # tried, then backed off
    assert {k for m, k in picks[100:] if m == "dm"} <= {3, 4, 5}  # K near the run length of 3


def test_stays_plain_when_nothing_is_accepted():
    planner = Planner(_members(pl=4, dm=4), max_k=8)
    picks = _simulate(planner, 400, lambda m, k, i: [0])
    seconds = sum(sum(_parts(None if m == K0 else m, k)) for m, k in picks)
    assert seconds <= 1.02 * 400 * PLAIN_S  # trials cost under 2% (first trials, then back-off doubling)
    assert _share(picks, K0) > 0.95


def test_follows_a_change_of_text():
    def accepts(member, k, i):
        good = "pl" if i < 150 else "dm"
        return [4] if member == good else [0]

    planner = Planner(_members(pl=4, dm=4), max_k=8)
    picks = _simulate(planner, 450, accepts)
    assert _share(picks[40:150], "pl") > 0.9
    assert _share(picks[300:], "dm") > 0.9


def test_shadow_scores_switch_to_prompt_lookup_without_a_trial():
    """Prompt lookup's proposals are scored while the draft model drafts: when the text turns copyable (from step
    60) the planner moves to prompt lookup within about ten steps (its evidence window turning over), before its
    next trial would be due."""
    from hf_sparse_verify.generation.policies.utility_policy import Step

    planner = Planner(_members(pl=4, dm=4), max_k=8)
    picks = []
    for i in range(90):
        member, k = planner.next_step(10**6)
        picks.append(member or K0)
        copyable = i >= 60
        good = {"dm": 2, "pl": 8 if copyable else 0}
        accepted = [min(k, good[member])] if member else [0]
        shadow = {}
        if (
            member != "pl"
        ):  # scored against the tokens the step committed: censored when it matched all of them
            emitted = 1 + accepted[0]
            shadow = {
                "pl": [(0, Step(emitted, emitted, (emitted,), 0.0) if copyable else Step(8, 8, (0,), 0.0))]
            }
        parts = _parts(member, k)
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={
            "member": member, "issued": k, "parts": parts, "shadow": shadow}))  # fmt: skip
    assert picks[10:60].count("dm") >= 48
    first_pl = next(i for i in range(60, 90) if picks[i] == "pl")
    assert first_pl <= 72 and picks[75:].count("pl") >= 14  # its 24-step evidence window turns over


def test_a_batch_is_rated_by_its_slowest_row():
    """Four rows: prompt lookup runs 8 tokens on two copy-heavy rows and none on the others (mean 2.5 drafts), the
    draft model 2 on every row. The batch needs as many steps as its slowest row: the draft model wins."""

    def accepts(member, k, i):
        return [8, 8, 0, 0] if member == "pl" else [2, 2, 2, 2]

    planner = Planner(_members(pl=4, dm=4), max_k=8, batch=4)
    picks = []
    for i in range(120):
        member, k = planner.next_step(10**6)
        picks.append(member or K0)
        accepted = [min(k, a) for a in accepts(member, k, i)] if member else [0] * 4
        parts = _parts(member, k)
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={
            "member": member, "issued": k, "parts": parts, "rows": accepted, "active": [True] * 4}))  # fmt: skip
    assert picks[20:].count("dm") >= 95


def test_noisy_rows_of_one_kind_are_not_rated_by_the_unluckiest():
    """Sixteen rows that all accept 2-6 drafts at random: the slowest-row rating must not mistake noise for a slow
    row and fall back to plain steps."""
    import random

    rng = random.Random(0)
    planner = Planner(_members(dm=4), max_k=8, batch=16)
    picks = []
    for i in range(150):
        member, k = planner.next_step(10**6)
        picks.append(member or K0)
        accepted = [min(k, rng.randint(2, 6)) for _ in range(16)] if member else [0] * 16
        parts = _parts(member, k)
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={
            "member": member, "issued": k, "parts": parts, "rows": accepted, "active": [True] * 16}))  # fmt: skip
    assert picks[20:].count("dm") >= 125


def test_k_climbs_while_every_draft_is_accepted():
    planner = Planner(_members(pl=4), max_k=12)
    picks = _simulate(planner, 60, lambda m, k, i: [k])
    assert picks[-1] == ("pl", 12)


def test_batch_trials_are_one_step():
    planner = Planner(_members(pl=4, dm=4), max_k=8, batch=8)
    picks = _simulate(planner, 6, lambda m, k, i: [0] * 8, rows=8)
    assert picks[:4] == [(K0, 0), (K0, 0), ("pl", 4), ("dm", 4)]


def test_profile_carries_to_the_next_call():
    profile = CostProfile()
    first = Planner(_members(pl=4), max_k=8, profile=profile)
    _simulate(first, 20, lambda m, k, i: [2])
    second = Planner(_members(pl=4), max_k=8, profile=profile)
    assert second.next_step(100) == ("pl", 4)  # no baseline steps: the plain step's cost is known


def test_a_costly_start_is_tried_only_where_it_pays():
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, 0.0, 0.8e-3, 0.2e-3)
    members = {"dm": Member(start_k=4, warm_share=0.5)}
    short = Planner(members, max_k=8, profile=profile)
    short.begin(prefill_s=2.0)  # its prefill: 1 s, against 0.1 s of plain decoding ahead
    assert short.next_step(remaining=100) == (None, 0)
    long = Planner(members, max_k=8, profile=profile)
    long.begin(prefill_s=2.0)  # against 100 s ahead
    assert long.next_step(remaining=100_000) == ("dm", 4)


def test_cost_profile_estimates():
    profile = CostProfile()
    profile.grows["pl"] = False
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.1)
        profile.add("dm", 2, 0.2, 1.2, 0.1)
        profile.add("dm", 4, 0.4, 1.4, 0.1)
        profile.add("pl", 4, 0.3, 1.4, 0.1)
    assert profile.cost(K0, 0) == pytest.approx(1.1)
    assert profile.verify_s(4) == pytest.approx(1.3)  # between measured widths (1, 3, 5)
    assert profile.verify_s(9) == pytest.approx(1.8)  # along the last two
    assert profile.draft_s("dm", 6) == pytest.approx(0.6)  # a line through K = 2 and 4
    assert profile.draft_s("pl", 8) == pytest.approx(0.3)  # a search: flat in K
    assert profile.draft_s("unseen", 4) is None and profile.cost("unseen", 4) is None


# ------------------------------------------------------------------------------------------------ the engine
MAX_NEW = 31


def _auto(model, ids, mask, draft=None, speculation=None, **kwargs):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=MAX_NEW,
        custom_generate=hsv.generate,
        speculation=speculation or dict(strategy="auto", max_draft_tokens=8),
        draft_model=draft,
        return_dict_in_generate=True,
        **kwargs,
    )


@pytest.mark.parametrize("with_draft", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_auto_greedy_equals_plain_generate(arch, batch, with_draft):
    model = make_model(arch)
    draft = noisy_copy(model) if with_draft else None
    ids, mask = ragged_batch(batch, length=40)
    ids[:, 20:] = torch.where(mask[:, 20:].bool(), ids[:, :20], ids[:, 20:])  # text worth looking up
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    for _ in range(2):  # the second call starts from the first one's profile
        out = _auto(model, ids, mask, draft)
        assert torch.equal(out.sequences, expected)
    stats = out.speculation
    assert stats.strategy == "auto" and stats.k_policy == "planner"
    allowed = {"k0", "prompt_lookup"} | ({"draft_model"} if with_draft else set())
    assert set(stats.chosen) <= allowed and sum(c["share"] for c in stats.chosen.values()) == pytest.approx(1)
    assert "ran: " in stats.summary() and "why (planner, steps)" in stats.summary()


def test_auto_on_cpu_drafts_without_vegas():
    model = make_model("llama")
    drafter = PortfolioDrafter.from_config(hsv.SpeculationConfig(), model, noisy_copy(model))
    assert list(drafter.members) == ["prompt_lookup", "draft_model"]
    assert list(PortfolioDrafter.from_config(hsv.SpeculationConfig(), model).members) == ["prompt_lookup"]


def test_tensor_parallel_ranks_plan_in_the_loop_on_agreed_evidence_only(monkeypatch):
    """Ranks must make the same choices: under tensor parallelism the planner runs in the loop (not in a child,
    whose choices depend on timing) with no planning share (whose renewals depend on each host's speed)."""
    model = make_model("llama")
    monkeypatch.setattr(generate_module, "tensor_parallel", lambda m: True)
    config = hsv.SpeculationConfig(planner_process=True)
    planner = generate_module._planner(config, PortfolioDrafter.from_config(config, model), model, 1, 64)
    assert isinstance(planner, Planner) and planner.plan_share is None


def test_generate_s_planner_keeps_to_the_planning_share():
    """The planner `generate` builds for `auto` limits its due renewals to `PLAN_SHARE` of the steps' seconds
    (tests that build a `Planner` themselves get none, so their choices do not depend on this machine's speed)."""
    model = make_model("llama")
    drafter = PortfolioDrafter.from_config(hsv.SpeculationConfig(), model)
    planner = generate_module._planner(hsv.SpeculationConfig(), drafter, model, 1, 64)
    assert planner.plan_share == planner_module.PLAN_SHARE > 0
    assert Planner(_members(pl=4), max_k=8).plan_share is None


class _Scripted(KPolicy):
    """Plays a fixed list of (member, K), then plain steps."""

    def __init__(self, script):
        super().__init__(0, 8)
        self.script = list(script)

    def next_k(self) -> int:
        return self.next_step(100)[1]

    def next_step(self, remaining: int):
        return self.script.pop(0) if self.script else (None, 0)


def test_auto_switches_drafters_inside_a_call_and_starts_the_draft_model_late(monkeypatch):
    model = make_model("llama")
    draft = noisy_copy(model)
    ids, mask = ragged_batch(3, length=30)
    script = [("prompt_lookup", 3), (None, 0), ("draft_model", 2), ("prompt_lookup", 4), ("draft_model", 5)]
    monkeypatch.setattr(generate_module, "_planner", lambda *a: _Scripted(script))
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    out = _auto(model, ids, mask, draft)
    assert torch.equal(out.sequences, expected)
    stats = out.speculation
    assert stats.members[:5] == ["prompt_lookup", None, "draft_model", "prompt_lookup", "draft_model"]
    assert stats.draft_tokens[2] == 2 and stats.draft_tokens[4] == 5


def test_auto_never_picking_the_draft_model_never_prefills_it(monkeypatch):
    model = make_model("llama")
    draft = noisy_copy(model)
    calls = {"target": 0, "draft": 0}
    monkeypatch.setattr(generate_module, "_planner", lambda *a: _Scripted([("prompt_lookup", 3)]))
    model.register_forward_hook(lambda *_: calls.__setitem__("target", calls["target"] + 1))
    draft.register_forward_hook(lambda *_: calls.__setitem__("draft", calls["draft"] + 1))
    ids, mask = ragged_batch(2, length=20)
    _auto(model, ids, mask, draft)
    assert calls["target"] > 0 and calls["draft"] == 0


def test_auto_samples_the_target_distribution_across_switches(monkeypatch):
    """4000 identical prompts, one sampled call: the first step drafts by prompt lookup (no probabilities), the
    second with the draft model (speculative sampling). Token pairs (t1, t2) and (t2, t3) must follow the target's
    exact joint distribution; many rows take t3 from the second step."""
    model, draft = e2e_pair()
    target_12, target_23 = _joint_next_tokens(model, E2E_PROMPT)
    script = [("prompt_lookup", 2), ("draft_model", 2)]
    monkeypatch.setattr(generate_module, "_planner", lambda *a: _Scripted(script))
    torch.manual_seed(0)
    out = model.generate(
        input_ids=torch.tensor([E2E_PROMPT]).repeat(E2E_ROWS, 1),
        max_new_tokens=5,
        do_sample=True,
        custom_generate=hsv.generate,
        speculation=dict(strategy="auto"),
        draft_model=draft,
        return_dict_in_generate=True,
    )
    stats = out.speculation
    assert stats.members[:2] == ["prompt_lookup", "draft_model"]
    took_second = sum(a == 0 for a in stats.accepted_tokens[0])  # rows whose t3 came from the second step
    assert took_second > 500
    new = out.sequences[:, len(E2E_PROMPT) :]
    assert _joint_pvalue(new[:, 0], new[:, 1], target_12) > 1e-3
    assert _joint_pvalue(new[:, 1], new[:, 2], target_23) > 1e-3


class _Recording(_Scripted):
    def __init__(self, script):
        super().__init__(script)
        self.shadow = []

    def observe(self, outcome: StepOutcome) -> None:
        for steps in outcome.extra.get("shadow", {}).values():
            self.shadow.extend(step for _, step in steps)


@pytest.mark.parametrize("device_search", [False, True])
def test_prompt_lookup_is_scored_against_the_continuation_while_others_draft(monkeypatch, device_search):
    """Plain steps only: every step, prompt lookup's proposal is scored against the row's own continuation once it
    is committed. The runs equal an independent recount from the final sequence, with the host index and with the
    all-rows device search (what long prompts on a GPU use)."""
    from hf_sparse_verify.generation.drafters.prompt_lookup import PromptLookupDrafter

    monkeypatch.setattr(PromptLookupDrafter, "searches_on_device", lambda self, state: device_search)
    import numpy as np

    from hf_sparse_verify.generation.drafters.portfolio import SHADOW_WIDTH
    from hf_sparse_verify.generation.drafters.prompt_lookup import lookup_ngram

    model = make_model("llama")
    ids = torch.randint(3, 90, (1, 24), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([ids, ids[:, :12]], dim=1)  # the continuation may copy
    policy = _Recording([])
    monkeypatch.setattr(generate_module, "_planner", lambda *a: policy)
    out = _auto(model, ids, torch.ones_like(ids))
    seq = out.sequences[0].tolist()
    expected = []
    for before in range(ids.shape[1] + 1, len(seq)):  # one plain step per token after the prefill's
        proposal = lookup_ngram(np.array(seq[:before]), SHADOW_WIDTH, 3, 1).tolist()
        continuation = seq[before : before + len(proposal)]
        run = next((i for i, (a, b) in enumerate(zip(proposal, continuation)) if a != b), len(continuation))
        expected.append(run)
    assert sorted(s.accepted[0] for s in policy.shadow) == sorted(expected)
    assert any(run > 0 for run in expected)  # the test sees matches, not only misses


def test_k_policy_plain_still_means_no_speculation():
    model = make_model("llama")
    ids, mask = ragged_batch(2)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy="auto", k_policy="plain"), return_dict_in_generate=True,
    )  # fmt: skip
    assert set(out.speculation.draft_tokens) == {0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_on_the_gpu_runs_every_drafter_and_a_second_call_captures_nothing(monkeypatch):
    """CUDA graphs, float32: a scripted plan through all three drafters (Vegas joins: the threshold is lowered for
    the short test prompt) keeps greedy output; the second call of the same shape captures nothing; the real planner
    keeps output too."""
    monkeypatch.setattr(generate_module, "VEGAS_MIN_PROMPT", 16)
    model = make_model("llama")
    draft = noisy_copy(model)
    model, draft = model.cuda(), draft.cuda()
    ids, mask = ragged_batch(3, length=40)
    ids, mask = ids.cuda(), mask.cuda()
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    script = [
        ("prompt_lookup", 3),
        ("vegas", 3),
        (None, 0),
        ("draft_model", 3),
        ("vegas", 5),
        ("prompt_lookup", 2),
    ]
    with monkeypatch.context() as scripted:
        scripted.setattr(generate_module, "_planner", lambda *a: _Scripted(script))
        first = _auto(model, ids, mask, draft)
        second = _auto(model, ids, mask, draft)
    for out in (first, second):
        assert torch.equal(out.sequences, expected)
        assert out.speculation.members[:6] == [m for m, _ in script]
    assert first.speculation.graph_capture_s > 0 and second.speculation.graph_capture_s == 0
    planned = _auto(model, ids, mask, draft)
    assert torch.equal(planned.sequences, expected)
    assert planned.speculation.graph_capture_s == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_drafter_first_chosen_in_a_later_call_captures_nothing(monkeypatch):
    """The first call of a shape never drafts with the draft model; the second switches to it: its graphs were
    captured by the first call (which started it), so the second captures nothing."""
    monkeypatch.setattr(generate_module, "VEGAS_MIN_PROMPT", 16)
    model = make_model("llama")
    draft = noisy_copy(model)
    model, draft = model.cuda(), draft.cuda()
    ids, mask = ragged_batch(2, length=40)
    ids, mask = ids.cuda(), mask.cuda()
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    outs = []
    for script in ([("prompt_lookup", 3), (None, 0)], [("draft_model", 3), ("vegas", 2), ("draft_model", 4)]):
        with monkeypatch.context() as scripted:
            scripted.setattr(generate_module, "_planner", lambda *a, s=script: _Scripted(s))
            outs.append(_auto(model, ids, mask, draft))
    for out in outs:
        assert torch.equal(out.sequences, expected)
    assert "draft_model" not in outs[0].speculation.members and "draft_model" in outs[1].speculation.members
    assert outs[0].speculation.graph_capture_s > 0 and outs[1].speculation.graph_capture_s == 0


def test_the_profile_travels_with_the_model(tmp_path):
    """A profile saved beside the model is what the first auto call in a fresh process plans from (no plain
    baseline steps); an entry of another shape is not used."""
    from hf_sparse_verify.generation import profiles

    model = make_model("llama")
    model.save_pretrained(tmp_path / "m")
    ids, mask = ragged_batch(1, length=40)
    first = _auto(model, ids, mask)
    assert first.speculation.policy_states[0]["reason"] == "baseline"
    path = hsv.save_profile(model, tmp_path / "m")
    assert path.endswith("speculation_profile.json")
    entry = json.loads(open(path).read())["entries"][0]
    assert entry["members"] == ["prompt_lookup"] and entry["batch"] == 1 and entry["device"] == "cpu"

    profiles._PROFILES.clear()  # a fresh process
    reloaded = type(model).from_pretrained(tmp_path / "m").eval()
    second = _auto(reloaded, ids, mask)
    assert second.speculation.policy_states[0]["reason"] != "baseline"
    assert torch.equal(second.sequences, first.sequences)
    other_batch, other_mask = ragged_batch(2, length=40)
    third = _auto(reloaded, other_batch, other_mask)  # another shape: measured afresh
    assert third.speculation.policy_states[0]["reason"] == "baseline"


def test_save_profile_without_auto_calls_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="strategy='auto'"):
        hsv.save_profile(make_model("llama"), tmp_path)


def test_a_priced_drafter_that_cannot_pay_is_not_tried():
    """The profile knows prompt lookup's steps cost 6 plain steps at any K (a verify of many tokens on a CPU, say):
    even at a good acceptance it could not pay, so a new call does not try it; a cheap one is tried."""
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.0)
        for k in (1, 4):
            profile.add("pl", k, 0.0, 6.0, 0.0)
    planner = Planner(_members(pl=4), max_k=8, profile=profile)
    picks = [planner.next_step(100) for _ in range(20)]
    assert set(picks) == {(None, 0)}
    cheap = CostProfile()
    for _ in range(3):
        cheap.add(K0, 0, 0.0, 1.0, 0.0)
        cheap.add("pl", 4, 0.0, 1.1, 0.0)
    assert Planner(_members(pl=4), max_k=8, profile=cheap).next_step(100)[0] == "pl"


def test_a_search_that_found_nothing_still_prices_every_k():
    """Prompt lookup's trial steps proposed nothing (K trimmed to 0), then its scored proposals turn perfect: its
    search cost is flat in K, so those steps price it at any K and the planner switches to it."""
    profile = CostProfile()
    profile.grows["pl"] = False
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.1)
        profile.add("pl", 0, 0.05, 1.0, 0.1)
    assert profile.cost("pl", 6) == pytest.approx(0.05 + 1.0 * (1 + 0.08 * 6) + 0.1)


def test_a_hub_model_s_profile_is_fetched_from_its_repository(tmp_path, monkeypatch):
    """A model loaded by Hub id: its profile comes from the repository (``hf_hub_download``; faked here with a local
    file), and a repository without one (or no network) simply measures afresh."""
    import huggingface_hub

    from hf_sparse_verify.generation import profiles

    model = make_model("llama")
    ids, mask = ragged_batch(1, length=40)
    _auto(model, ids, mask)
    saved = hsv.save_profile(model, tmp_path)
    profiles._PROFILES.clear()
    fetched = []

    def fake_download(repo_id, filename, **kwargs):
        fetched.append((repo_id, filename))
        if repo_id == "org/has-profile":
            return saved
        raise OSError("no such file in the repository")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    model.name_or_path = "org/has-profile"
    assert _auto(model, ids, mask).speculation.policy_states[0]["reason"] != "baseline"
    profiles._PROFILES.clear()
    model.name_or_path = "org/no-profile"
    assert _auto(model, ids, mask).speculation.policy_states[0]["reason"] == "baseline"
    assert fetched == [
        ("org/has-profile", "speculation_profile.json"),
        ("org/no-profile", "speculation_profile.json"),
    ]


def test_a_one_off_cost_at_one_k_does_not_price_a_search_out():
    """Prompt lookup's search costs the same at every K: one slow step at K = 6 (a kernel compiled for it) must not
    price K = 6 at that step's cost for the rest of the profile's life."""
    profile = CostProfile()
    profile.grows["pl"] = False
    for k in (4, 4, 4, 2, 0):
        profile.add("pl", k, 0.0002, 0.001, 0.0001)
    profile.add("pl", 6, 0.3, 0.001, 0.0001)  # one step with a 300 ms compile inside
    assert profile.draft_s("pl", 6) == pytest.approx(0.0002)
    assert profile.draft_s("pl", 9) == pytest.approx(0.0002)
    profile.grows["dm"] = True  # a draft model's cost grows with K: priced per K as before
    for _ in range(3):
        profile.add("dm", 2, 0.002, 0.001, 0.0001)
    assert profile.draft_s("dm", 4) == pytest.approx(0.004)


def _simulate_rows(planner: Planner, accepts, rows: int, new_tokens: int, limit: int = 400) -> list:
    """Steps until every row has ``new_tokens`` (rows stop; ``remaining`` and ``active`` are reported as the loop
    reports them); ``accepts(member, k, row, i)`` gives a row's accepted drafts."""
    done, picks = [0] * rows, []
    for i in range(limit):
        active = [d < new_tokens for d in done]
        if not any(active):
            break
        member, k = planner.next_step(max(new_tokens - d for d, a in zip(done, active) if a))
        picks.append((member or K0, k))
        accepted = []
        for row in range(rows):
            if not active[row]:
                accepted.append(None)
                continue
            a = min(k, accepts(member, k, row, i), new_tokens - done[row] - 1) if member else 0
            accepted.append(a)
            done[row] += a + 1
        parts = _parts(member, k)
        planner.observe(StepOutcome(i, k, [a for a in accepted if a is not None], sum(parts), extra={
            "member": member, "issued": k, "parts": parts, "rows": accepted,
            "active": [d < new_tokens for d in done], "remaining": [new_tokens - d for d in done]}))  # fmt: skip
    return picks


def test_rows_that_finished_stop_vouching_for_a_drafter():
    """Prompt lookup copies whole drafts on rows 1-3 and nothing on row 0; the draft model runs 2 on every row. Row 0
    needs the most steps whatever drafts, so the call is as long as the draft model makes it: once rows 1-3 are
    done (or not), prompt lookup's long runs there must not keep it drafting for row 0."""

    def accepts(member, k, row, i):
        if member == "pl":
            return 0 if row == 0 else k
        return 2

    planner = Planner(_members(pl=4, dm=4), max_k=8, batch=4)
    picks = _simulate_rows(planner, accepts, rows=4, new_tokens=120)
    assert sum(m == "pl" for m, _ in picks) <= 6
    assert len(picks) <= 1.15 * 120 / 3  # about as many steps as the draft model alone needs for row 0


def test_recent_runs_weigh_more():
    """18 full runs then 6 misses: the misses weigh more than the 18 older runs (half weight every 6 runs), so
    the row's estimate has fallen by half; the reverse order keeps it high."""
    from hf_sparse_verify.generation.policies.planner import row_expected_tokens

    age = np.arange(23, -1, -1)[None, :]  # oldest first
    issued = np.full((1, 24), 8)
    turned = np.array([[8] * 18 + [0] * 6])
    recovered = np.array([[0] * 6 + [8] * 18])
    assert row_expected_tokens(age, issued, turned, 8)[0, 8] < 5.0  # 9 tokens per step before the misses
    assert row_expected_tokens(age, issued, recovered, 8)[0, 8] > 7.0


def test_a_drafter_priced_out_is_tried_once_the_best_fades():
    """The draft model cannot beat prompt lookup's first steps even at a good acceptance, so it is not tried then;
    when prompt lookup's runs stop (step 20 on), it is tried without waiting out a back-off."""
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, *_parts(None, 0))
        for k in (2, 4):
            profile.add("dm", k, *_parts("dm", k))
    planner = Planner(_members(pl=4, dm=4), max_k=8, profile=profile)
    picks = _simulate(planner, 60, lambda m, k, i: [k if i < 20 else 0] if m == "pl" else [2])
    assert "dm" not in [m for m, _ in picks[:18]]
    first_dm = next(i for i, (m, _) in enumerate(picks) if m == "dm")
    assert first_dm <= 30


class _Ordered(_Scripted):
    """A scripted policy that records the order of its hooks."""

    def __init__(self, script):
        super().__init__(script)
        self.calls = []

    def next_step(self, remaining: int):
        self.calls.append("next")
        return super().next_step(remaining)

    def prepare(self) -> None:
        self.calls.append("prepare")

    def observe(self, outcome: StepOutcome) -> None:
        self.calls.append("observe")


def test_the_loop_lets_the_policy_prepare_before_each_readback(monkeypatch):
    """Every step: the choice, then `prepare` (while the device verifies), then `observe` (after the readback)."""
    model = make_model("llama")
    policy = _Ordered([("prompt_lookup", 3), (None, 0), ("prompt_lookup", 2)])
    monkeypatch.setattr(generate_module, "_planner", lambda *a: policy)
    ids, mask = ragged_batch(2, length=20)
    out = _auto(model, ids, mask)
    steps = out.speculation.steps
    assert policy.calls == ["next", "prepare", "observe"] * steps


def test_prepared_estimates_keep_the_choices():
    """Estimates made by `prepare` (one step behind, kept a few steps) choose as fresh ones do on a steady text."""
    fresh = Planner(_members(pl=4, dm=4), max_k=8)
    lagged = Planner(_members(pl=4, dm=4), max_k=8)
    picks = {}
    for name, planner in (("fresh", fresh), ("lagged", lagged)):
        chosen = []
        for i in range(120):
            member, k = planner.next_step(10**6)
            chosen.append(member or K0)
            if name == "lagged":
                planner.prepare()
            accepted = [min(k, 3)] if member == "dm" else [0]
            parts = _parts(member, k)
            planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k,
                                                                            "parts": parts}))  # fmt: skip
        picks[name] = chosen
    assert picks["lagged"][30:].count("dm") >= 85 and picks["fresh"][30:].count("dm") >= 85


def test_cost_vectors_equal_the_scalar_costs():
    """`CostProfile.costs` (what the planner reads every step) prices every K as `cost` does: measured widths and
    Ks, interpolated and extrapolated ones, a flat search, a single measured K through the origin."""
    profile = CostProfile()
    profile.grows["pl"] = False
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.1)
        profile.add("dm", 2, 0.2, 1.2, 0.1)
        profile.add("dm", 5, 0.45, 1.5, 0.12)
        profile.add("pl", 4, 0.3, 1.4, 0.1)
        profile.add("pl", 0, 0.25, 1.0, 0.1)
        profile.add("one", 3, 0.3, 1.3, 0.2)
    for member in ("dm", "pl", "one", K0):
        vector = profile.costs(member, 12)
        for k in range(13):
            scalar = profile.cost(member, k)
            if scalar is None:  # not estimable (a plain step drafts nothing): NaN in the vector
                assert np.isnan(vector[k]), (member, k)
            else:
                assert vector[k] == pytest.approx(scalar), (member, k)


def test_one_unlucky_run_does_not_pin_a_row_at_k_1():
    """A row whose only run at K = 4 stopped after one draft, then runs at K = 1 that all succeed: it borrows the
    other rows' hazard beyond 1 (its own runs never test j = 2), so K = 4 is worth more than K = 1 to it."""
    from hf_sparse_verify.generation.policies.planner import row_expected_tokens

    age = np.array([[4, 3, 2, 1, 0], [4, 3, 2, 1, 0]])
    issued = np.array([[4, 1, 1, 1, 1], [4, 4, 4, 4, 4]])
    accepted = np.array([[1, 1, 1, 1, 1], [4, 4, 4, 4, 4]])
    tokens = row_expected_tokens(age, issued, accepted, 4)
    assert tokens[0, 4] > tokens[0, 1] + 0.5


def test_planning_happens_in_prepare_not_after_the_readback(monkeypatch):
    """With `prepare` called while the device verifies, `observe` (right after the readback) only keeps the outcome
    and `next_step` hands out the prepared choice: no estimate runs between the readback and the next launch."""
    planner = Planner(_members(pl=4, dm=4), max_k=8)
    estimates = []
    real = planner_module.row_expected_tokens
    monkeypatch.setattr(planner_module, "row_expected_tokens", lambda *a: estimates.append(1) or real(*a))
    after_readback = 0
    for i in range(60):
        before = len(estimates)
        member, k = planner.next_step(10**6)
        if i > 0:
            after_readback += len(estimates) - before
        planner.prepare()
        before = len(estimates)
        accepted = [min(k, 3)] if member == "dm" else [0]
        parts = _parts(member, k)
        planner.observe(
            StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k, "parts": parts})
        )
        after_readback += len(estimates) - before
    assert estimates, "prepare never estimated"
    assert after_readback == 0
    assert planner.current[0] == "dm"  # the lagged choices still find the drafter that pays


def test_estimates_are_refreshed_one_drafter_per_step(monkeypatch):
    """On a steady text, `prepare` renews the estimates of one drafter per step (the current one's, or the oldest
    past `_REPLAN_EVERY` steps), so no step's planning grows with the number of drafters; every estimate is still
    renewed within `_REPLAN_EVERY` + the number of drafters steps."""
    planner = Planner(_members(pl=4, dm=4, sd=4), max_k=8, batch=2)
    renewed = []
    real = Planner._estimate
    monkeypatch.setattr(Planner, "_estimate", lambda self, name: renewed[-1].append(name) or real(self, name))
    for i in range(120):
        member, k = planner.next_step(10**6)
        renewed.append([])
        planner.prepare()
        accepted = [min(k, 3), min(k, 2)] if member == "dm" else [0, 0]
        parts = _parts(member, k)
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k,
                                                                        "parts": parts}))  # fmt: skip
    steady = renewed[60:]
    assert planner.current[0] == "dm" and planner.trial is None
    assert max(len([n for n in r if n != K0]) for r in steady) == 1  # the plain step's (a median) besides
    bound = planner_module._REPLAN_EVERY + 4
    for name in (K0, "pl", "dm", "sd"):
        at = [i for i, r in enumerate(steady) if name in r]
        assert at and max(b - a for a, b in zip([0, *at], [*at, len(steady) - 1])) <= bound, (name, at)


def test_runs_keep_each_row_s_last_window_in_order():
    """`_Runs` (per-row rings) holds what per-row lists of the last `_ROW_WINDOW` runs hold, ages counted from each
    row's newest run, through random additions with a row twice in one call and rows beyond the announced batch."""
    import random

    from hf_sparse_verify.generation.policies.planner import _ROW_WINDOW, _Runs

    rng = random.Random(0)
    kept, lists = _Runs(3), {}
    for _ in range(200):
        rows = [rng.randrange(5) for _ in range(rng.randint(1, 4))]
        issued = [rng.randint(1, 8) for _ in rows]
        accepted = [rng.randint(0, i) for i in issued]
        kept.add_rows(rows, issued, accepted)
        for r, i, a in zip(rows, issued, accepted):
            lists[r] = (lists.get(r, []) + [(i, a)])[-_ROW_WINDOW:]
        for r, runs in lists.items():
            filled = kept.order[r] >= 0
            age = kept.count[r] - 1 - kept.order[r][filled]
            held = sorted(zip(age, kept.issued[r][filled], kept.accepted[r][filled]))
            assert held == [(len(runs) - 1 - n, i, a) for n, (i, a) in reversed(list(enumerate(runs)))], r
    assert kept.largest_k(range(5)) == max(i for runs in lists.values() for i, _ in runs)
    assert not kept.any([7]) and kept.largest_k([7]) == 0


def test_a_streak_s_next_run_follows_the_newest_run(monkeypatch):
    """Runs come in streaks (prompt lookup: copied text, then fresh): two misses after ten full runs rate the row
    by what followed misses, not by the streak before; one full run after misses rates it by what followed hits.
    Without the weighting (`_OTHER_REGIME` 1) the old streak keeps the estimate up."""
    from hf_sparse_verify.generation.policies.planner import _Runs

    def tokens(runs, other):
        monkeypatch.setattr(planner_module, "_OTHER_REGIME", other)
        kept = _Runs(1)
        for accepted in runs:
            kept.add_rows([0], [8], [accepted])
        return kept.expected_tokens([0], 8)[0][0, 8]

    streaks = [8] * 6 + [0] * 6 + [8] * 6
    after_misses = streaks + [0, 0]
    assert tokens(after_misses, 0.2) < tokens(after_misses, 1.0) - 1.0
    back = after_misses + [8]
    assert tokens(back, 0.2) > tokens(back, 1.0) + 0.5
    steady = [
        8,
        3,
        8,
        5,
        8,
        2,
        8,
        6,
    ] * 3  # no streaks (a hit after every run): the weighting changes ~nothing
    assert tokens(steady, 0.2) == pytest.approx(tokens(steady, 1.0), rel=0.01)


def test_wider_verifies_are_priced_along_all_measured_widths():
    """Beyond the widest measured verify, the price follows the slope of every measured width: two neighbouring
    widths whose medians differ by noise do not price wider verifies out."""
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.00, 0.1)  # width 1
        profile.add("pl", 12, 0.1, 1.12, 0.1)  # width 13
        profile.add("pl", 13, 0.1, 1.20, 0.1)  # width 14: a noisy bump
    slope = profile._verify_slope()
    assert 0.0 < slope < 0.02
    assert profile.verify_s(17) == pytest.approx(1.20 + 3 * slope)
    assert profile.verify_s(17) < 1.20 + 3 * 0.08 / 2  # not the last two widths' slope
    assert profile.verify_s(7) == pytest.approx(1.0 + 6 * 0.12 / 12)  # between measured widths: interpolated


def test_k_climbs_when_every_draft_is_accepted_despite_a_noisy_verify_bump():
    """A flat-cost drafter accepting every draft climbs to the largest K even when the widest verify it measured
    came out a little dear (one H100, 1 x 4K: K stayed at 13 of 16 with every draft accepted)."""
    planner = Planner(_members(pl=14), max_k=16, baseline_steps=0)
    profile = planner.profile
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.00, 0.2)
    for i in range(12):
        member, k = planner.next_step(10**6)
        assert member == "pl"
        verify = 1.0 + 0.01 * k + (0.1 if k == 14 else 0.0)  # width 15 measured dear by noise
        parts = (0.05, verify, 0.2)
        planner.observe(
            StepOutcome(i, k, [k], sum(parts), extra={"member": member, "issued": k, "parts": parts})
        )
    assert k == 16


def test_first_trials_priced_by_the_acceptance_of_earlier_calls():
    """A drafter that accepted little in the profile's earlier calls is not tried in a new call where another
    drafter already runs well; with no earlier calls it is tried (at the optimistic prior)."""
    profile = CostProfile()

    def call(planner, steps=60):
        return _simulate(
            planner, steps, lambda m, k, i: [k if m == "pl" and i % 3 else (1 if m == "dm" else 0)]
        )

    first = Planner(_members(pl=4, dm=4), max_k=8, profile=profile)
    picks = call(first)
    assert any(m == "dm" for m, _ in picks)  # tried in the first call
    assert profile.prior_acceptance("dm") == pytest.approx(0.9)  # the current call does not count yet
    second = Planner(_members(pl=4, dm=4), max_k=8, profile=profile)
    assert profile.prior_acceptance("dm") < 0.8
    picks = call(second)
    assert not any(m == "dm" for m, _ in picks)


def test_prior_acceptance_takes_the_best_recent_call():
    profile = CostProfile()
    for accepted, ended in ((2, 10), (30, 10), (0, 0)):  # the last call did not run it
        profile.start_call(["a"])
        profile.add_runs("a", accepted, ended)
    profile.start_call(["a"])  # the current call
    assert profile.prior_acceptance("a") == pytest.approx((30 + 2 * 0.9) / (40 + 2))
    assert CostProfile().prior_acceptance("a") == pytest.approx(0.9)


def test_k_climbs_every_step_while_every_draft_is_accepted():
    """With estimates kept between re-plans, a drafter whose every draft is accepted still climbs K by half each
    step (one H100, 1 x 16K random tokens: after plain steps whose shadow scores showed prompt lookup turning
    copyable, its K went 2 -> 4 -> 16 four steps apart)."""
    from hf_sparse_verify.generation.policies.utility_policy import Step

    planner = Planner(_members(pl=4), max_k=16, baseline_steps=0)
    for _ in range(3):
        planner.profile.add(K0, 0, 0.0, 1.0, 0.2)
        planner.profile.add("pl", 4, 0.05, 1.04, 0.2)
    ks = []
    for i in range(40):
        member, k = planner.next_step(10**6)
        ks.append(k)
        planner.prepare()
        parts = (0.05 if k else 0.0, 1.0 + 0.01 * k, 0.2)
        accepted = [k] if i >= 12 else [0]  # the text turns copyable at step 12
        shadow = {}
        if member != "pl":  # scored against the one token a plain step commits: censored there
            shadow = {"pl": [(0, Step(1, 1, (1,), 0.0) if i >= 12 else Step(8, 8, (0,), 0.0))]}
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={
            "member": member, "issued": k, "parts": parts, "shadow": shadow}))  # fmt: skip
    first = next(i for i, k in enumerate(ks) if i >= 12 and k > 0)
    run = ks[first:]
    assert all(b >= a for a, b in zip(run, run[1:])), ks  # never back down while every draft is accepted
    assert run[2] > run[0] and (run[3] > run[2] or run[2] == 16), ks  # up every step, not once per re-plan
    assert run.count(16) >= len(run) - 6, ks


def test_a_drafter_dear_per_k_climbs_only_where_its_estimate_says_so():
    """After a step where every draft was accepted, K climbs by half at once for a drafter whose drafting costs the
    same at any K (prompt lookup); one whose drafting grows with K climbs only where its estimate values the
    climbed K at least as much (one H200, 1 x 16K: Vegas climbed 7 -> 10 -> 15 on full acceptances, and the steps
    at 13-16 kept 0-6 drafts at nearly twice the cost)."""
    planner = Planner(_members(pl=4, dm=4), max_k=16)
    falling = np.array([np.nan] + [10.0 - k for k in range(1, 17)])  # utility at K = 0 .. 16
    rising = np.array([np.nan] + [float(k) for k in range(1, 17)])
    for name, values, climbs in (("dm", falling, False), ("dm", rising, True), ("pl", falling, True)):
        planner._memo[("u", name)] = values
        planner._filled, planner.current = (name, 6), (name, 6)
        assert planner._climb_pays() is climbs, (name, values)


def test_a_turn_of_the_text_renews_the_drafter_s_estimate_at_once():
    """When most rows that hit at a drafter's last step miss at this one (or the reverse), its estimate is renewed
    by the next `prepare`, not up to `_REPLAN_EVERY` steps later."""

    def renewals(turn: int | None) -> list[int]:
        planner = Planner(_members(dm=4), max_k=16, baseline_steps=0, batch=4)
        renewed = []
        real = Planner._renew
        planner._renew = lambda name: renewed.append(planner.step) or real(planner, name)
        for i in range(26):
            member, k = planner.next_step(10**6)
            planner.prepare()
            hit = turn is None or i < turn
            accepted = [min(k, 3) if hit else 0] * 4 if member == "dm" else [0] * 4
            parts = _parts(member, k)
            planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k,
                                                                            "parts": parts}))  # fmt: skip
        return renewed

    steady = renewals(None)
    # a turn at a step whose outcome the regular renewals would not take in (it is taken in by the `prepare` of
    # the next step, at ``step`` = turn + 2)
    turn = next(t for t in range(16, 24) if t + 2 not in steady)
    assert turn + 2 in renewals(turn), (turn, steady)


def test_renewals_that_are_merely_due_keep_to_the_planning_share(monkeypatch):
    """With ``plan_share``, renewals that are merely due run only as often as their host time fits that share of
    the steps' seconds (here a renewal takes 2 ms of host time and a step about 1.5 ms: at a share of 0.25, one
    per 5 steps at most); without it, every due estimate is renewed at its turn."""

    class Clock:  # every reading 2 ms after the last: a renewal (two readings) takes 2 ms of host time
        now = 0.0

        def perf_counter(self):
            Clock.now += 2e-3
            return Clock.now

    monkeypatch.setattr(planner_module, "time", Clock())

    def renewals(share):
        planner = Planner(_members(pl=4, dm=4), max_k=8, batch=2, plan_share=share)
        renewed = []
        real = Planner._renew

        def renew(name):
            if name != K0:
                renewed.append(planner.step)
            real(planner, name)

        planner._renew = renew
        for i in range(100):
            member, k = planner.next_step(10**6)
            planner.prepare()
            accepted = [min(k, 3), min(k, 2)] if member == "dm" else [0, 0]
            parts = _parts(member, k)
            planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k,
                                                                            "parts": parts}))  # fmt: skip
        return [r for r in renewed if r > 50], planner

    free, free_planner = renewals(None)
    kept, kept_planner = renewals(0.25)
    assert free_planner.current[0] == kept_planner.current[0] == "dm"
    gaps = [b - a for a, b in zip(kept, kept[1:])]
    assert len(free) >= 20 and kept and min(gaps) >= 5, (free, kept)  # a step of ~1.5 ms: 2 / (0.25 * 1.5)


def test_k_falls_at_once_when_a_wide_verify_stops_paying():
    """Prompt lookup at K = 16 on text it copies, then on text where its runs stop at 2: K falls to where the
    estimate says within a few steps, not 2 per estimate (one H200, 4 x 16K: K stayed 13-16 for 40 steps while
    K = 4 ran 1.3x faster)."""
    planner = Planner(_members(pl=4), max_k=16, baseline_steps=0)
    for _ in range(3):  # a verify dear per token: a wide one must pay for itself
        planner.profile.add(K0, 0, 0.0, 1.0, 0.2)
        for k in (1, 4, 8, 16):
            planner.profile.add("pl", k, 0.05, 1.0 + 0.15 * k, 0.2)
    ks = []
    for i in range(60):
        member, k = planner.next_step(10**6)
        planner.prepare()
        ks.append(k if member == "pl" else 0)
        accepted = [k if i < 20 else min(k, 2)] if member == "pl" else [0]
        parts = (0.05 if k else 0.0, 1.0 + 0.15 * k, 0.2)
        planner.observe(StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k,
                                                                        "parts": parts}))  # fmt: skip
    assert max(ks[10:20]) >= 12, ks  # climbed on the copied text
    assert max(ks[40:]) <= 4, (
        ks
    )  # and came down at once when the estimate turned (by 2 per estimate: 10 at 41)


def test_no_planning_while_a_flat_cost_drafter_fills_the_largest_k(monkeypatch):
    """While prompt lookup (drafting cost flat in K) has every draft accepted at the largest K, nothing can emit more
    per step for less: `prepare` keeps the choice without estimating. A drafter whose cost grows with K is still
    re-planned (a cheaper one could emit as much)."""
    estimates = []
    real = planner_module.row_expected_tokens
    monkeypatch.setattr(planner_module, "row_expected_tokens", lambda *a: estimates.append(1) or real(*a))
    for name, planned in (("pl", False), ("dm", True)):
        planner = Planner(_members(**{name: 16}), max_k=16, baseline_steps=0)
        for _ in range(3):
            planner.profile.add(K0, 0, 0.0, 1.0, 0.2)
        ks = []
        for i in range(20):
            member, k = planner.next_step(10**6)
            ks.append(k)
            if i == 8:
                estimates.clear()
            planner.prepare()
            parts = (0.05 if name == "pl" else 0.01 * k, 1.0 + 0.01 * k, 0.2)
            planner.observe(
                StepOutcome(i, k, [k], sum(parts), extra={"member": member, "issued": k, "parts": parts})
            )
        assert ks[-1] == 16, ks
        assert bool(estimates) == planned, name


def test_a_switch_to_a_drafter_is_priced_with_its_catch_up():
    """A draft model's first step after others drafted costs its catch-up: the planner measures that extra, and a
    switch to it must pay for it over `_SWITCH_HORIZON` steps, so near-equal drafters are not flipped between."""
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.2)
        profile.add("dm", 4, 0.4, 1.2, 0.2)
    planner = Planner(_members(pl=4, dm=4), max_k=8, profile=profile)
    assert planner._after_switch("dm", 4, 2.0) == 2.0  # no switch measured yet
    planner._last_ran = "pl"
    planner.state_of["dm"].steps = 1  # it drafted earlier in this call
    planner._take(
        StepOutcome(0, 4, [4], 3.8, extra={"member": "dm", "issued": 4, "parts": (2.4, 1.2, 0.2)}), kept=False
    )
    planner._absorb()  # what an estimate does before it reads the profile
    assert profile.switch_s("dm") == pytest.approx(2.0)  # 2.4 s against its usual 0.4 s
    cost = profile.cost("dm", 4)
    expected = 2.0 * cost * planner_module._SWITCH_HORIZON / (cost * planner_module._SWITCH_HORIZON + 2.0)
    assert planner._after_switch("dm", 4, 2.0) == pytest.approx(expected)
    assert planner._after_switch(None, 0, 2.0) == 2.0


def test_batch_pace_counts_luck_and_real_slow_rows():
    """`batch_pace`: one row is rated by its own tokens; rows of one kind whose runs come in bursts are rated below
    their mean (the last of 32 rows lags) but above the unluckiest row's recent estimate; where half the rows
    truly run nothing (plenty of runs, all misses) the batch is rated near one token per step."""
    k = 8
    rng = np.random.default_rng(0)
    age = np.tile(np.arange(23, -1, -1), (32, 1))
    accepted = np.where(rng.random((32, 24)) < 0.4, k, 0)  # each row: 0 or all 8 drafts, at random
    per_row = planner_module.row_expected_tokens(age, np.full((32, 24), k), accepted, k)
    w = 0.5 ** (age / planner_module._HALF_LIFE)
    weight = w.sum(axis=1) ** 2 / (w**2).sum(axis=1)
    remaining = np.full(32, 256.0)
    pace = planner_module.batch_pace(per_row, weight, remaining)
    mean = per_row[:, k].mean()
    assert per_row[:, k].min() + 0.3 < pace[k] < mean - 0.5
    one = planner_module.batch_pace(per_row[:1], weight[:1], remaining[:1])
    np.testing.assert_allclose(one, np.maximum(np.minimum(per_row[0], 256.0), 1.0))
    stuck = accepted.copy()
    stuck[::2] = 0  # every other row never accepts a draft
    per_row = planner_module.row_expected_tokens(age, np.full((32, 24), k), stuck, k)
    assert planner_module.batch_pace(per_row, weight, remaining)[k] < 0.6 * pace[k]


def test_a_profile_is_not_inherited_through_a_reused_id():
    """A model freed and another of the same shape built at the same address (its ``id``): the new model starts
    from its own profile, and saving it writes only its own entries."""
    from hf_sparse_verify.generation import profiles

    first, second = make_model("llama"), make_model("llama")
    key = ("same id", "same shape")
    old = profiles.profile_for(first, key, ["prompt_lookup", "draft_model"], 1, 40)
    assert profiles.profile_for(first, key, ["prompt_lookup", "draft_model"], 1, 40) is old
    fresh = profiles.profile_for(second, key, ["prompt_lookup"], 1, 40)  # the key the freed model left behind
    assert fresh is not old
    assert [k["members"] for k, _, owner in profiles._PROFILES.values() if owner() is second] == [
        ["prompt_lookup"]
    ]


# ------------------------------------------------------------------------------------------------ planner process
def test_auto_in_the_planner_process_equals_plain_generate():
    """``planner_process=True``: the planner runs in a child process; the output is plain
    ``generate``'s, the child's choices and reports reach the stats, and the profile it measured comes back."""
    model = make_model("llama")
    ids, mask = ragged_batch(2, length=40)
    ids[:, 20:] = torch.where(mask[:, 20:].bool(), ids[:, :20], ids[:, 20:])
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    drafter = PortfolioDrafter.from_config(hsv.SpeculationConfig(planner_process=True), model)
    policy = generate_module._planner(hsv.SpeculationConfig(planner_process=True), drafter, model, 2, 40)
    assert isinstance(policy, remote_module.RemotePlanner)
    policy.finish()  # frees the child for the calls below
    for _ in range(2):
        out = _auto(
            model, ids, mask, speculation=dict(strategy="auto", max_draft_tokens=8, planner_process=True)
        )
        assert torch.equal(out.sequences, expected)
    stats = out.speculation
    assert stats.k_policy == "planner" and stats.policy_states and "member" in stats.policy_states[-1]
    assert set(stats.chosen) <= {"k0", "prompt_lookup"}
    assert policy.profile.verify, "the child's measurements came back into the shared profile"


def _drive(policy, steps: int, accepts) -> list:
    picks = []
    policy.begin(0.01)
    for i in range(steps):
        member, k = policy.next_step(10**6)
        picks.append((member or K0, k))
        accepted = [min(k, accepts(member))] if member else [0]
        parts = _parts(member, k)
        policy.observe(
            StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k, "parts": parts})
        )
        time.sleep(0.002)  # a step: the child plans meanwhile
    return picks


def test_the_planner_process_finds_the_drafter_that_pays():
    """The child's choices are the planner's: of a drafter right on 2 of every draft and one never right, it
    settles on the first (as the in-loop planner does, `test_picks_the_drafter_that_pays`)."""
    remote = remote_module.remote_planner(_members(pl=4, dm=4), 8, 1, CostProfile())
    assert remote is not None
    picks = _drive(remote, 60, lambda member: 2 if member == "pl" else 0)
    remote.finish()
    assert _share(picks[-20:], "pl") >= 0.9, picks


def test_a_call_that_raised_leaves_the_planner_process_free():
    """A call that ends without `finish` (an exception in the loop) frees the child when it is collected, and
    its late answers do not reach the next call."""
    first = remote_module.remote_planner(_members(pl=4), 8, 1, CostProfile())
    _drive(first, 5, lambda member: 2)
    del first
    gc.collect()
    second = remote_module.remote_planner(_members(pl=4, dm=4), 8, 1, CostProfile())
    assert second is not None
    picks = _drive(second, 30, lambda member: 2 if member == "dm" else 0)
    second.finish()
    assert {m for m, _ in picks} <= {K0, "pl", "dm"}


def test_a_failure_in_the_planner_process_is_raised_with_its_traceback():
    remote = remote_module.remote_planner(_members(pl=4), 8, 1, CostProfile())
    remote.begin(0.01)
    remote.next_step(10)
    remote._conn.send_bytes(b"o" + bytes(8))  # an outcome cut short: the child cannot read it
    with pytest.raises(RuntimeError, match="(?s)planner process failed.*Error"):
        for _ in range(200):
            remote.next_step(10)
            time.sleep(0.01)
    remote._release()


def test_outcomes_cross_to_the_planner_process_intact():
    """What `Planner` reads of an outcome survives the compact encoding (finished rows, scored proposals, parts)."""
    from hf_sparse_verify.generation.policies.utility_policy import Step

    outcome = StepOutcome(7, 5, [2, 5], 3e-3, extra={
        "member": "dm", "issued": 6, "parts": (1e-3, 1.5e-3, 5e-4), "rows": [2, None, 5],
        "active": [True, False, True], "remaining": [40, 0, 12],
        "shadow": {"pl": [(0, Step(8, 8, (3,), 0.0)), (2, Step(8, 8, (8,), 0.0))]}})  # fmt: skip
    back = remote_module._decode(remote_module._encode(outcome, {"pl": 0, "dm": 1}), ["pl", "dm"])
    assert (back.index, back.k, back.accepted, back.time_s) == (7, 5, [2, 5], 3e-3)
    for key in ("member", "issued", "parts", "rows", "active", "remaining"):
        assert back.extra[key] == outcome.extra[key], key
    assert [(row, s.issued, s.accepted) for row, s in back.extra["shadow"]["pl"]] == [(0, 8, (3,)), (2, 8, (8,))]
    plain = StepOutcome(0, 0, [0], None, extra={"member": None, "issued": 0})
    back = remote_module._decode(remote_module._encode(plain, {}), [])
    assert back.extra["member"] is None and back.time_s is None and back.extra["parts"] is None


def test_a_planner_process_that_died_is_reported_and_replaced():
    remote = remote_module.remote_planner(_members(pl=4), 8, 1, CostProfile())
    remote.begin(0.01)
    remote.next_step(10)
    remote._server.proc.kill()
    remote._server.proc.wait()
    with pytest.raises(RuntimeError, match="planner process ended"):
        for _ in range(100):
            remote.next_step(10)
            time.sleep(0.01)
    remote._release()
    again = remote_module.remote_planner(_members(pl=4), 8, 1, CostProfile())
    assert again is not None and again._server is not remote._server
    assert _drive(again, 3, lambda member: 1)
    again.finish()


def test_draft_cost_between_and_beyond_measured_ks_never_falls_with_k():
    """A drafter whose drafting grows with K is priced between measured Ks by interpolation and beyond them along a
    slope that is never negative: one inflated measurement at a small K (a catch-up) cannot make larger Ks look
    free."""
    profile = CostProfile()
    for _ in range(3):
        profile.add("dm", 1, 0.007, 1.0, 0.1)  # inflated (a catch-up at K = 1)
        profile.add("dm", 4, 0.0016, 1.0, 0.1)
        profile.add("dm", 6, 0.0020, 1.0, 0.1)
    assert profile.draft_s("dm", 5) == pytest.approx(0.0018)  # between 4 and 6
    assert profile.draft_s("dm", 9) >= profile.draft_s("dm", 6) == pytest.approx(0.0020)  # flat at worst
    assert profile.draft_s("dm", 2) == pytest.approx(0.007 - (0.007 - 0.0016) / 3)
    single = CostProfile()
    single.add("dm", 4, 0.4, 1.0, 0.1)
    assert single.draft_s("dm", 8) == pytest.approx(0.8)  # through the origin from one K


def test_a_switch_step_prices_the_switch_not_its_k():
    """The catch-up of a step right after a switch goes to the switch's price; the drafter's cost at that K keeps
    its usual steps only."""
    profile = CostProfile()
    for _ in range(3):
        profile.add(K0, 0, 0.0, 1.0, 0.2)
        profile.add("dm", 4, 0.4, 1.2, 0.2)
    planner = Planner(_members(pl=4, dm=4), max_k=8, profile=profile)
    planner._last_ran = "pl"
    planner.state_of["dm"].steps = 1
    planner._take(
        StepOutcome(0, 4, [4], 3.8, extra={"member": "dm", "issued": 4, "parts": (2.4, 1.2, 0.2)}), kept=False
    )
    planner._absorb()
    assert profile.switch_s("dm") == pytest.approx(2.0)
    assert list(profile.draft[("dm", 4)]) == [0.4, 0.4, 0.4]
    assert len(profile.verify[5]) == 4  # the step's verify and update still count


def test_the_running_drafter_that_turned_is_renewed_whatever_the_share():
    """Prompt lookup at a high K whose row stops hitting: its estimate is renewed every few steps while its steps
    keep missing it (`_surprised`), even when the planning share allows no renewal (a host whose renewals look
    dear), so it stops verifying 17 tokens that are all rejected."""
    planner = Planner(_members(pl=4), max_k=16, plan_share=0.05)
    picks = []
    for i in range(80):
        member, k = planner.next_step(10**6)
        picks.append((member or K0, k))
        planner.prepare()  # as the loop does: while this step verifies
        if i == 40:
            planner._renew_s = 10.0  # from here the share never allows a renewal
        hit = i < 40  # copied text, then fresh text
        accepted = [k if hit else 0] if member else [0]
        parts = _parts(member, k)
        planner.observe(
            StepOutcome(i, k, accepted, sum(parts), extra={"member": member, "issued": k, "parts": parts})
        )
    assert max(k for _, k in picks[30:40]) == 16  # climbed while every draft was accepted
    # the estimate follows the misses within a few renewals, the share notwithstanding: 17-token verifies stop (but
    # for a trial after the back-off)
    assert sum(k == 16 for _, k in picks[56:]) <= 2, picks[40:]
