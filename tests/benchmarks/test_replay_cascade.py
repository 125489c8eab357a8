"""`benchmarks/replay_cascade.py` replays requests offline as the decoding loop runs them: on a tiny random model
its per-step K and accepted drafts equal those of `generate` with prompt lookup, for static K and for a policy
that learns from the accepted drafts (transformers' heuristic schedule, which ignores step times)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_model

import hf_sparse_verify as hsv
from hf_sparse_verify.generation.drafters.prompt_lookup import PromptLookupDrafter

sys.path.insert(
    0, str(Path(__file__).resolve().parents[2])
)  # the repository root, holding the benchmarks package
from benchmarks import replay_cascade as replay  # noqa: E402

NEW_TOKENS = 40


@pytest.fixture(scope="module")
def case():
    model = make_model("llama")
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 40, (1, 24), generator=gen)
    prompt = torch.cat([prompt, prompt[:, :12]], dim=1)  # a repeat, so prompt lookup has drafts to find
    greedy = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                            do_sample=False, eos_token_id=None)  # fmt: skip
    continuation = greedy[0, prompt.shape[1] :].tolist()
    assert len(continuation) == NEW_TOKENS
    drafter = PromptLookupDrafter.from_config(hsv.SpeculationConfig(strategy="prompt_lookup"))
    table = replay.draft_table(prompt[0].tolist(), continuation, 8, drafter)
    return model, prompt, replay.Request("tiny", "good", 0, NEW_TOKENS, table)


@pytest.mark.parametrize(
    "speculation",
    [
        dict(strategy="prompt_lookup", num_draft_tokens=3),
        dict(strategy="prompt_lookup", num_draft_tokens=8),
        dict(strategy="prompt_lookup", k_policy="heuristic", num_draft_tokens=2, max_draft_tokens=8),
    ],
)
def test_replay_steps_equal_the_loop(case, speculation):
    model, prompt, request = case
    out = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, do_sample=False,
        eos_token_id=None, custom_generate=hsv.generate, speculation=speculation, return_dict_in_generate=True,
    )  # fmt: skip
    stats = out.speculation
    factory, max_k = replay.policy_factory(speculation)
    cost = replay.CostModel("unit", 1.0, tuple(1.0 for _ in range(9)), 0.0, 0.0, (1.0,))
    run = replay.replay_request(request, factory(), max_k, cost, random.Random(0))
    assert run.ks == list(stats.draft_tokens)
    assert run.accepted_steps == [row[0] for row in stats.accepted_tokens]
    assert sum(run.ks) > 0 and sum(run.accepted_steps) > 0  # drafts were found and accepted
