"""Greedy output with every drafter equals plain ``model.generate(do_sample=False)`` token for token (float32)."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import ARCHITECTURES, char_tokenizer, make_model, noisy_copy, ragged_batch
from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

import hf_sparse_verify as hsv
from hf_sparse_verify.generation.policies.k_policy import KPolicy
from hf_sparse_verify.registry import K_POLICIES

MAX_NEW = 23  # not a multiple of K + 1 for any K tested


@functools.cache
def _pair(arch: str):
    model = make_model(arch)
    return model, noisy_copy(model)


def _speculate(model, ids, mask, strategy, k, draft=None, **kwargs):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy=strategy, num_draft_tokens=k),
        draft_model=draft if strategy == "draft_model" else None,
        return_dict_in_generate=True,
        **kwargs,
    )


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_greedy_equals_plain_generate(arch, batch, strategy, k):
    model, draft = _pair(arch)
    ids, mask = ragged_batch(batch)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    out = _speculate(model, ids, mask, strategy, k, draft, max_new_tokens=MAX_NEW)
    assert torch.equal(out.sequences, expected)
    stats = out.speculation
    assert stats.steps >= 1 and max(stats.draft_tokens) <= k
    assert max(stats.new_tokens) == expected.shape[1] - ids.shape[1]
    assert model.config._attn_implementation != "sparse_verify"


def test_drafts_are_accepted_and_rejected():
    """The noisy draft must exercise both paths, or the equality tests above prove little."""
    model, draft = _pair("llama")
    ids, mask = ragged_batch(3)
    stats = _speculate(model, ids, mask, "draft_model", 3, draft, max_new_tokens=MAX_NEW).speculation
    accepted = [a for row in stats.accepted_tokens for a in row if a is not None]
    assert any(a == 3 for a in accepted) and any(a < 3 for a in accepted)
    assert 1.0 < stats.mean_acceptance_length < 4.0


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3_moe"])
def test_perfect_draft_is_always_accepted(arch):
    """The target drafting for itself must have every draft accepted, in every row of a ragged batch
    (positions, padding and the draft cache's catch-up and rollback all line up)."""
    model = make_model(arch)
    ids, mask = ragged_batch(3)
    out = _speculate(model, ids, mask, "draft_model", 4, model, max_new_tokens=31)
    stats = out.speculation
    for k, row in zip(stats.draft_tokens, stats.accepted_tokens):
        assert all(a == k for a in row if a is not None), (k, row)
    assert stats.mean_acceptance_length == 5.0


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
def test_eos_inside_accepted_drafts(strategy):
    """EOS chosen as a token plain greedy emits mid-sequence; with a perfect draft it arrives inside a block."""
    model = make_model("llama")
    ids, mask = ragged_batch(3)
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    eos = int(plain[0, ids.shape[1] + 9])
    expected = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos
    )
    out = _speculate(model, ids, mask, strategy, 8, model, max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert torch.equal(out.sequences, expected)
    assert (expected == eos).any(dim=1).all() or (expected[:, ids.shape[1] :] == eos).any()
    if strategy == "draft_model":  # the perfect draft accepts everything: EOS arrived inside accepted drafts
        assert max(a for row in out.speculation.accepted_tokens for a in row if a is not None) >= 2


def test_min_new_tokens_and_repetition_penalty():
    model, draft = _pair("qwen3")
    ids, mask = ragged_batch(3)
    kwargs = dict(max_new_tokens=MAX_NEW, min_new_tokens=12, repetition_penalty=1.3, no_repeat_ngram_size=3)
    expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kwargs)
    for strategy in ("prompt_lookup", "draft_model"):
        out = _speculate(model, ids, mask, strategy, 3, draft, **kwargs)
        assert torch.equal(out.sequences, expected), strategy


def _stop_string_case():
    model, draft = _pair("llama")
    tok = char_tokenizer()
    ids, mask = ragged_batch(1)
    plain = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    stop = tok.decode(plain[0, ids.shape[1] + 6 : ids.shape[1] + 8])
    expected = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        stop_strings=[stop],
        tokenizer=tok,
    )
    assert expected.shape[1] < plain.shape[1], "the stop string must cut generation short"
    return model, draft, tok, ids, mask, stop, expected


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
def test_stop_strings_callable(strategy):
    model, draft, tok, ids, mask, stop, expected = _stop_string_case()
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer=tok, stop_strings=[stop])])
    out = _speculate(model, ids, mask, strategy, 3, draft, max_new_tokens=MAX_NEW, stopping_criteria=criteria)
    assert torch.equal(out.sequences, expected)


def test_stop_strings_from_arguments():
    model, draft, tok, ids, mask, stop, expected = _stop_string_case()
    out = hsv.generate_from_arguments(
        model,
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        stop_strings=[stop],
        tokenizer=tok,
        speculation={"strategy": "draft_model"},
        assistant_model=draft,
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("policy", ["constant", "heuristic", "utility", "plain"])
def test_k_policies_keep_output(policy):
    model, draft = _pair("mistral")
    ids, mask = ragged_batch(3)
    new = 120 if policy == "utility" else 40
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy="draft_model", num_draft_tokens=2, k_policy=policy, max_draft_tokens=6),
        draft_model=draft,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    ks = out.speculation.draft_tokens
    if policy == "heuristic":
        assert len(set(ks)) > 1 and max(ks) <= 6
    elif policy == "utility":  # baseline K = 0 steps, then trials at several K
        assert ks[:4] == [0, 0, 0, 0] and len(set(ks)) > 2 and max(ks) <= 6
        assert {s["phase"] for s in out.speculation.policy_states} >= {"baseline", "test"}
    elif policy == "plain":
        assert set(ks) == {0}
    else:
        assert set(ks[:-2]) == {2} and set(ks) <= {0, 1, 2}  # K shrinks only at the very end (no room left)


class AlternatingKPolicy(KPolicy):
    """Eight plain decode steps (K = 0), then eight steps with K = 4, and so on: longer than one catch-up chunk
    (max_draft_tokens + 1 = 5 tokens), so the draft model catches up over several forwards."""

    def __init__(self, start_k: int, max_k: int):
        super().__init__(0, max_k)
        self.calls = 0

    def next_k(self) -> int:
        self.calls += 1
        return 0 if (self.calls // 8) % 2 == 0 else 4


def test_plain_decode_steps_and_drafter_catch_up(monkeypatch):
    """K = 0 phases between drafting steps: the draft model catches up on tokens it never saw."""
    monkeypatch.setitem(K_POLICIES, "alternating", f"{__name__}:AlternatingKPolicy")
    model, draft = _pair("llama")
    ids, mask = ragged_batch(3)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=60, do_sample=False)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=60,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(
            strategy="draft_model", num_draft_tokens=4, k_policy="alternating", max_draft_tokens=4
        ),
        draft_model=draft,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert 0 in out.speculation.draft_tokens and 4 in out.speculation.draft_tokens


def test_streamer_matches_plain_generate():
    class Recorder:
        def __init__(self):
            self.chunks = []
            self.ended = 0

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended += 1

    model, draft = _pair("llama")
    ids, mask = ragged_batch(3)
    plain, ours = Recorder(), Recorder()
    model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, streamer=plain
    )
    _speculate(model, ids, mask, "draft_model", 3, draft, max_new_tokens=MAX_NEW, streamer=ours)
    assert ours.chunks == plain.chunks and ours.ended == plain.ended == 1


def test_unpadded_batch_and_attention_mask_omitted():
    model, draft = _pair("qwen2")
    ids = ragged_batch(2)[0][:, 7:]
    expected = model.generate(input_ids=ids, max_new_tokens=MAX_NEW, do_sample=False)
    out = model.generate(
        input_ids=ids,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        custom_generate=hsv.generate,
        draft_model=draft,
    )
    assert torch.equal(out, expected)


@pytest.mark.fixtures
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
@pytest.mark.parametrize("batch", [1, 3])
def test_trained_fixtures_greedy(shared_models, strategy, batch):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("code-target", "code-draft"):
        if not (shared_models / name).is_dir():
            pytest.skip(f"{shared_models / name} is absent (a partial copy of ../shared/models)")
    target = AutoModelForCausalLM.from_pretrained(shared_models / "code-target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(shared_models / "code-draft", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(shared_models / "code-target")
    tok.padding_side = "left"
    prompts = [json.loads(line) for line in open(shared_models / "prompts.jsonl")]
    texts = [p["text"] for p in prompts if p["len"] == 512][:batch]
    texts = [t[: 600 + 300 * i] for i, t in enumerate(texts)]  # ragged lengths
    inputs = tok(texts, return_tensors="pt", padding=True)
    expected = target.generate(**inputs, max_new_tokens=48, do_sample=False)
    out = target.generate(
        **inputs,
        max_new_tokens=48,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy=strategy, num_draft_tokens=4),
        draft_model=draft if strategy == "draft_model" else None,
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert out.speculation.mean_acceptance_length > 1.2


@pytest.mark.fixtures
def test_trained_fixtures_utility_policy_keeps_output(shared_models):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(shared_models / "code-target", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(shared_models / "code-target")
    text = next(json.loads(line)["text"] for line in open(shared_models / "prompts.jsonl"))
    inputs = tok(text, return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=96, do_sample=False)
    out = target.generate(
        **inputs,
        max_new_tokens=96,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy="prompt_lookup", k_policy="utility", max_draft_tokens=8),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert len(set(out.speculation.draft_tokens)) > 2
