"""Verification rules: hand-built exact cases, seeded determinism, chi-square tests that emitted tokens follow the
target distribution (and that deliberately wrong rules fail the same tests), and one end-to-end distribution test
through ``model.generate(do_sample=True)`` with a draft model."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, noisy_copy
from scipy.stats import chisquare

import hf_sparse_verify
from hf_sparse_verify.generation.drafters.low_bit import low_bit_copy
from hf_sparse_verify.generation.verification.verify import (
    verify_greedy,
    verify_sampling_without_probs,
    verify_speculative_sampling,
)

V = 6
VERIFIERS = ("greedy", "without_probs", "speculative")


# ------------------------------------------------------------------------------------------------------- helpers
def _one_hot_scores(targets: list[list[int]], vocab: int = V) -> torch.Tensor:
    """``[B, K + 1, V]`` scores whose softmax puts all mass on ``targets`` (so sampling is deterministic)."""
    index = torch.tensor(targets)
    scores = torch.full((*index.shape, vocab), float("-inf"))
    return scores.scatter_(-1, index[..., None], 0.0)


def _draft_probs(drafts: torch.Tensor, vocab: int = V) -> torch.Tensor:
    """``[B, K, V]`` drafter distributions: 0.5 on the draft, the rest spread (every token has q > 0)."""
    probs = torch.full((*drafts.shape, vocab), 0.5 / (vocab - 1))
    return probs.scatter_(-1, drafts[..., None], 0.5)


def _verify(name: str, drafts, num_drafts, scores, generator=None):
    drafts, num_drafts = (
        torch.as_tensor(drafts, dtype=torch.long),
        torch.as_tensor(num_drafts, dtype=torch.long),
    )
    if name == "greedy":
        return verify_greedy(drafts, num_drafts, scores)
    if name == "without_probs":
        return verify_sampling_without_probs(drafts, num_drafts, scores, generator=generator)
    return verify_speculative_sampling(drafts, num_drafts, _draft_probs(drafts), scores, generator=generator)


def _emitted(accepted: torch.Tensor, tokens: torch.Tensor) -> list[list[int]]:
    return [tokens[b, : int(accepted[b]) + 1].tolist() for b in range(tokens.shape[0])]


def _chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of "``samples`` (ints in ``[0, V)``) are draws from ``probs``"."""
    observed = torch.bincount(samples, minlength=probs.numel()).double()
    expected = probs.double() * observed.sum() / probs.double().sum()
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


# ------------------------------------------------------------------------------------------- hand-built cases
# targets: the only token the target allows at each of the K + 1 positions
TARGETS = [2, 4, 1, 5]


@pytest.mark.parametrize("name", VERIFIERS)
@pytest.mark.parametrize(
    "drafts, num_drafts, accepted, emitted",
    [
        pytest.param([2, 4, 1], 3, 3, [2, 4, 1, 5], id="all-accepted-bonus-after-last-draft"),
        pytest.param([3, 4, 1], 3, 0, [2], id="first-rejected-bonus-is-correction"),
        pytest.param([2, 3, 1], 3, 1, [2, 4], id="second-rejected"),
        pytest.param([2, 4, 0], 3, 2, [2, 4, 1], id="last-rejected"),
        pytest.param([2, 4, 1], 1, 1, [2, 4], id="drafts-past-count-never-accepted"),
        pytest.param([2, 4, 1], 0, 0, [2], id="zero-drafts-proposed"),
    ],
)
def test_single_row(name, drafts, num_drafts, accepted, emitted):
    got_accepted, tokens = _verify(name, [drafts], [num_drafts], _one_hot_scores([TARGETS]))
    assert tokens.shape == (1, 4) and tokens.dtype == torch.long
    assert got_accepted.tolist() == [accepted]
    assert _emitted(got_accepted, tokens) == [emitted]


@pytest.mark.parametrize("name", VERIFIERS)
def test_empty_draft_is_one_token_from_position_zero(name):
    scores = _one_hot_scores([[3], [5]])  # [B=2, K+1=1, V]
    accepted, tokens = _verify(name, torch.zeros(2, 0, dtype=torch.long), [0, 0], scores)
    assert accepted.tolist() == [0, 0]
    assert tokens.tolist() == [[3], [5]]


@pytest.mark.parametrize("name", VERIFIERS)
def test_rows_with_different_outcomes(name):
    targets = [[2, 4, 1, 5], [2, 4, 1, 5], [3, 3, 3, 0], [1, 2, 3, 4], [5, 0, 2, 1]]
    drafts = [
        [2, 4, 1],  # all accepted -> bonus from position 3
        [0, 4, 1],  # first rejected -> correction 2
        [3, 3, 3],  # only 1 proposed: drafts 2 and 3 match but must not be accepted
        [1, 2, 3],  # none proposed although all match
        [5, 3, 2],  # second rejected
    ]
    accepted, tokens = _verify(name, drafts, [3, 3, 1, 0, 3], _one_hot_scores(targets))
    assert accepted.tolist() == [3, 0, 1, 0, 1]
    assert _emitted(accepted, tokens) == [[2, 4, 1, 5], [2], [3, 3], [1], [5, 0]]


def test_greedy_uses_argmax_of_soft_scores():
    scores = torch.tensor([[[0.1, 0.3, 0.2], [0.5, 0.1, 0.4], [0.0, 0.0, 1.0]]])  # argmax 1, 0, 2
    accepted, tokens = verify_greedy(torch.tensor([[1, 2]]), torch.tensor([2]), scores)
    assert accepted.tolist() == [1]
    assert tokens[0, :2].tolist() == [1, 0]


def test_speculative_bonus_after_short_draft_is_drawn_from_p_not_residual():
    """Row proposed n=1 < K=2 drafts: the bonus at position 1 comes from p, ignoring q (the padding draft's
    distribution), and the padding draft is never accepted even though p gives it mass."""
    batch = 4000
    scores = torch.full((batch, 3, V), float("-inf"))
    scores[:, 0, 2] = 0.0  # p_0: all mass on the draft 2 -> always accepted
    scores[:, 1, 3] = scores[:, 1, 4] = 0.0  # p_1: 1/2 on 3, 1/2 on 4
    scores[:, 2, 5] = 0.0
    drafts = torch.tensor([[2, 3]]).repeat(batch, 1)
    q = torch.zeros(batch, 2, V)
    q[:, 0, 2] = 1.0
    q[:, 1, 3] = 1.0  # residual max(p_1 - q_1, 0) would always give 4
    gen = torch.Generator().manual_seed(0)
    accepted, tokens = verify_speculative_sampling(
        drafts, torch.ones(batch, dtype=torch.long), q, scores, gen
    )
    assert accepted.eq(1).all()
    bonus = tokens[:, 1]
    assert set(bonus.unique().tolist()) == {3, 4}
    assert 0.46 < bonus.eq(3).double().mean().item() < 0.54


@pytest.mark.parametrize("name", ["without_probs", "speculative"])
def test_seeded_generator_is_deterministic(name):
    batch, k = 2000, 3
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(batch, k + 1, V, generator=gen)
    drafts = torch.randint(0, V, (batch, k), generator=gen)
    num_drafts = torch.randint(0, k + 1, (batch,), generator=gen)

    def run(seed: int, global_seed: int):
        torch.manual_seed(global_seed)  # the global RNG must not matter
        return _verify(name, drafts, num_drafts, scores, torch.Generator().manual_seed(seed))

    accepted_a, tokens_a = run(123, 0)
    accepted_b, tokens_b = run(123, 1)
    accepted_c, tokens_c = run(124, 0)
    assert torch.equal(accepted_a, accepted_b) and torch.equal(tokens_a, tokens_b)
    assert not torch.equal(tokens_a, tokens_c)
    assert accepted_a.le(num_drafts).all()


# --------------------------------------------------------------------------------------------- statistical tests
B, K = 200_000, 3


def _random_distributions(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(rows, V, generator=gen).pow(2) + 0.02
    return weights / weights.sum(-1, keepdim=True)  # [rows, V]


@pytest.fixture(scope="module")
def spec_case():
    """Fixed target distributions ``p`` ``[K + 1, V]``, drafter distributions ``q`` ``[K, V]`` and B drafts
    sampled from q."""
    p = _random_distributions(K + 1, seed=1)
    q = _random_distributions(K, seed=2)
    gen = torch.Generator().manual_seed(3)
    drafts = torch.stack(
        [torch.multinomial(q[i], B, replacement=True, generator=gen) for i in range(K)], dim=1
    )
    scores = p.log()[None].expand(B, K + 1, V).contiguous()
    draft_probs = q[None].expand(B, K, V).contiguous()
    return p, q, drafts, draft_probs, scores


def _position_pvalues(p: torch.Tensor, accepted: torch.Tensor, tokens: torch.Tensor) -> list[float]:
    """For every position i: among rows with accepted >= i, emitted token i must be distributed as p_i (the
    target does not depend on the prefix here, so each emitted token is an independent draw from p_i)."""
    return [_chi2_pvalue(tokens[accepted >= i, i], p[i]) for i in range(p.shape[0])]


def test_speculative_sampling_matches_target_distribution(spec_case):
    p, _, drafts, draft_probs, scores = spec_case
    gen = torch.Generator().manual_seed(11)
    accepted, tokens = verify_speculative_sampling(drafts, torch.full((B,), K), draft_probs, scores, gen)
    counts = torch.bincount(accepted, minlength=K + 1)
    assert counts.min() > 5000, counts  # every outcome (0..K accepted) is well represented
    pvalues = _position_pvalues(p, accepted, tokens)
    assert min(pvalues) > 1e-3, pvalues


def _wrong_speculative_sampling(drafts, draft_probs, scores, generator, rule: str):
    """Speculative sampling with one deliberate mistake: ``"q/p"`` accepts with min(1, q/p) instead of p/q;
    ``"bonus_from_p"`` draws the correction from p instead of the residual max(p - q, 0)."""
    batch, k = drafts.shape
    p = torch.softmax(scores, dim=-1)
    q = draft_probs
    p_d = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)
    q_d = q.gather(-1, drafts[..., None]).squeeze(-1)
    uniform = torch.rand(batch, k, generator=generator)
    keep = uniform * p_d < q_d if rule == "q/p" else uniform * q_d < p_d
    accepted = keep.long().cumprod(1).sum(1)
    p_at = p[torch.arange(batch), accepted]
    q_at = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[torch.arange(batch), accepted]
    residual = p_at if rule == "bonus_from_p" else (p_at - q_at).clamp_min(0)
    bonus = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    tokens = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1).scatter(
        1, accepted[:, None], bonus[:, None]
    )
    return accepted, tokens


@pytest.mark.parametrize("rule", ["q/p", "bonus_from_p"])
def test_wrong_acceptance_rule_fails_the_same_test(spec_case, rule):
    p, _, drafts, draft_probs, scores = spec_case
    gen = torch.Generator().manual_seed(11)
    accepted, tokens = _wrong_speculative_sampling(drafts, draft_probs, scores, gen, rule)
    assert _chi2_pvalue(tokens[:, 0], p[0]) < 1e-6


def _constant_draft(p: torch.Tensor) -> torch.Tensor:
    """The same draft in every row (like an n-gram match): the target's likeliest token at each position, so
    many rows reach the later positions."""
    return p[:K].argmax(-1)[None].expand(B, K).contiguous()


def test_sampling_without_probs_matches_target_distribution(spec_case):
    p, _, _, _, scores = spec_case
    drafts = _constant_draft(p)
    gen = torch.Generator().manual_seed(12)
    accepted, tokens = verify_sampling_without_probs(drafts, torch.full((B,), K), scores, gen)
    assert torch.bincount(accepted, minlength=K + 1).min() > 100
    pvalues = _position_pvalues(p, accepted, tokens)
    assert min(pvalues) > 1e-3, pvalues


def test_sampling_without_probs_wrong_rule_fails_the_same_test(spec_case):
    """Resampling the bonus afresh at the first mismatch (instead of keeping the mismatching sample) gives the
    draft token too much mass."""
    p, _, _, _, scores = spec_case
    drafts = _constant_draft(p)
    gen = torch.Generator().manual_seed(12)
    accepted, _ = verify_sampling_without_probs(drafts, torch.full((B,), K), scores, gen)
    fresh = torch.multinomial(p[0], B, replacement=True, generator=gen)
    first = torch.where(accepted > 0, drafts[:, 0], fresh)
    assert _chi2_pvalue(first, p[0]) < 1e-6


# --------------------------------------------------------------------------------------------------- end to end
E2E_VOCAB, E2E_ROWS, E2E_PROMPT = 8, 4000, [3, 5, 2]


def _joint_next_tokens(model, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ``P(t1, t2)`` and ``P(t2, t3)`` (``[V, V]`` each, float64) of the next three tokens sampled from
    ``model`` at temperature 1, from one float32 forward of every ``prompt + [t1, t2]``."""
    vocab, length = E2E_VOCAB, len(prompt)
    pairs = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))  # [V*V, 2] (t1, t2)
    seqs = torch.cat([torch.tensor(prompt).repeat(vocab * vocab, 1), pairs], dim=1)
    with torch.no_grad():
        probs = model(input_ids=seqs).logits.float().softmax(-1).double()  # [V*V, L+2, V]
    p1 = probs[0, length - 1]  # [V]: t1
    p2 = probs[:, length].view(vocab, vocab, vocab)[:, 0]  # [t1, t2]
    p3 = probs[:, length + 1].view(vocab, vocab, vocab)  # [t1, t2, t3]
    joint_12 = p1[:, None] * p2
    joint_23 = torch.einsum("a,ab,abc->bc", p1, p2, p3)
    return joint_12, joint_23


def _joint_pvalue(first: torch.Tensor, second: torch.Tensor, joint: torch.Tensor) -> float:
    """Chi-square of observed token pairs against ``joint`` ``[V, V]``; cells expected < 5 are merged."""
    observed = torch.bincount(first * E2E_VOCAB + second, minlength=E2E_VOCAB**2).double()
    expected = joint.flatten() / joint.sum() * observed.sum()
    small = expected < 5
    obs = observed[~small].tolist() + ([observed[small].sum().item()] if small.any() else [])
    exp = expected[~small].tolist() + ([expected[small].sum().item()] if small.any() else [])
    return float(chisquare(obs, exp).pvalue)


def e2e_model():
    """A one-layer Llama over `E2E_VOCAB` tokens (exact joint distributions of a few tokens are cheap)."""
    tiny = dict(
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return make_model(
        "llama", vocab_size=E2E_VOCAB, pad_token_id=0, eos_token_id=None, bos_token_id=None, **tiny
    )


def e2e_pair():
    """`e2e_model` and a noisy copy of it as the draft model."""
    model = e2e_model()
    return model, noisy_copy(model, scale=0.5)


@pytest.mark.parametrize("draft_kind", ["noisy", "int4"])
def test_generate_with_draft_model_samples_the_target_distribution(draft_kind):
    """4000 identical prompts in one sampled generate call: the first token comes from the prefill, the next
    ones from one speculative step with K = 2 drafts of a noisy draft model (or of its int4 copy, whose linear layers
    run the low-bit kernel: the target's own int4 copy agrees with it too often here for the test to have power).
    Token pairs (t1, t2) and (t2, t3) must follow the target model's exact
    joint distribution, and not the draft's."""
    model, draft = e2e_pair()
    if draft_kind == "int4":
        draft = low_bit_copy(draft, "int4", group_size=16)
    target_12, target_23 = _joint_next_tokens(model, E2E_PROMPT)
    _, draft_23 = _joint_next_tokens(draft, E2E_PROMPT)

    torch.manual_seed(0)
    out = model.generate(
        input_ids=torch.tensor([E2E_PROMPT]).repeat(E2E_ROWS, 1),
        max_new_tokens=4,  # prefill token + a step with K = min(2, remaining - 1) = 2
        do_sample=True,
        custom_generate=hf_sparse_verify.generate,
        speculation=dict(strategy="draft_model", num_draft_tokens=2),
        draft_model=draft,
        return_dict_in_generate=True,
    )
    stats = out.speculation
    assert stats.strategy == "draft_model"
    assert stats.draft_tokens[0] == 2
    first_step = torch.tensor(stats.accepted_tokens[0])
    assert torch.bincount(first_step, minlength=3).min() > 200, first_step  # 0, 1 and 2 accepted all occur
    new = out.sequences[:, len(E2E_PROMPT) :]
    assert new.shape == (E2E_ROWS, 4)

    assert _joint_pvalue(new[:, 0], new[:, 1], target_12) > 1e-3
    assert _joint_pvalue(new[:, 1], new[:, 2], target_23) > 1e-3
    # the same test rejects the draft model's distribution: it has the power to catch a lossy sampler
    assert _joint_pvalue(new[:, 1], new[:, 2], draft_23) < 1e-6, float((draft_23 - target_23).abs().sum())
