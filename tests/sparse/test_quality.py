"""The teacher-forced quality harness of lossy sparse verification (`hf_sparse_verify.drivers.quality`): its dense
path is the model's own teacher-forced forward, it sees the damage a sparse setting does, and classes are granted
only on measured evidence."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from hf_sparse_verify.drivers.quality import (
    Quality,
    copied_share,
    edit_similarity,
    grant,
    next_line_examples,
    next_line_task,
    paired_delta,
    score_window,
    teacher_forced,
    verify_logprobs,
)
from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention

#: block-sparse verify attention that acts on a short prompt: 16-token blocks, a fifth of them kept, from 64 tokens
AGGRESSIVE = LossySparseVerify(
    attention=SparseAttention(block_size=16, rho=0.2, dense_below=64, local_blocks=1)
)


def _window(seed: int = 0, prompt: int = 200, continuation: int = 30):
    ids = torch.randint(3, 90, (prompt + continuation,), generator=torch.Generator().manual_seed(seed))
    return ids[:prompt], ids[prompt:]


def test_dense_verify_path_is_the_teacher_forced_forward():
    model = make_model("llama")
    prompt, continuation = _window()
    ours = verify_logprobs(model, prompt, continuation, None, window=7)
    full = torch.cat([prompt, continuation])[None]
    with torch.no_grad():
        logits = model(full).logits[0, prompt.numel() : -1].float()  # predicting continuation[1:]
    torch.testing.assert_close(ours, torch.log_softmax(logits, -1), rtol=1e-4, atol=1e-4)


def test_a_sparse_setting_shows_damage_and_dense_shows_none():
    model = make_model("llama")
    windows = [_window(seed) for seed in range(3)]
    results = teacher_forced(model, windows, {"dense_again": None, "aggressive": AGGRESSIVE}, progress=False)
    dense = results["dense_again"].summary()
    assert dense["delta_nll_pct"] == pytest.approx(0.0, abs=1e-6) and dense["top1"] == 1.0
    assert dense["kl"] == pytest.approx(0.0, abs=1e-6) and dense["flips_margin1"] == 0
    assert dense["positions"] == 3 * 29 and dense["windows"] == 3
    hurt = results["aggressive"].summary()
    assert (
        hurt["kl"] > 1e-4 and hurt["top1"] < 1.0
    )  # skipping most of a random prompt's blocks changes outputs
    low, high = hurt["delta_nll_ci"]
    assert low <= hurt["delta_nll_pct"] <= high


def test_score_window_counts_flips_only_where_dense_was_sure():
    dense = torch.log_softmax(torch.tensor([[3.0, 0.0, 0.0], [1.0, 0.9, 0.0]]), -1)
    other = torch.log_softmax(torch.tensor([[0.0, 3.0, 0.0], [0.9, 1.0, 0.0]]), -1)
    scores = score_window(dense, other, torch.tensor([0, 0]))
    assert scores.top1 == 0 and scores.flips_margin1 == 1  # the second position's margin is 0.1
    assert scores.nll > scores.nll_dense


def test_grant_needs_every_gate_measured():
    near = dict(delta_nll_pct=0.05, delta_nll_ci=[0.0, 0.1], top1=0.99, kl=0.001, flips_margin1=0)
    assert grant(near) == ("near_exact", "")
    mild = dict(near, delta_nll_pct=0.6, top1=0.96, kl=0.02, flips_margin1=2)
    klass, why = grant(mild)  # balanced's free-running and task gates are not measured
    assert klass == "fast" and "em_delta not measured" in why and "accept_ratio not measured" in why
    klass, why = grant(dict(mild, em_delta=-0.5, accept_ratio=1.01))
    assert klass == "balanced" and "delta_nll_pct" in why
    assert grant(dict(mild, em_delta=-0.5, accept_ratio=1.2))[0] == "fast"


def test_bootstrap_interval_is_paired_over_windows():
    quality = Quality()
    from hf_sparse_verify.drivers.quality import WindowScores

    for nll in (1.0, 1.02, 0.99, 1.01):  # dense 1.0 per position in each window
        quality.windows.append(WindowScores(positions=10, nll=10 * nll, nll_dense=10.0, top1=10))
    s = quality.summary(bootstrap=500)
    assert s["delta_nll_pct"] == pytest.approx(0.5)
    assert -1.0 < s["delta_nll_ci"][0] < 0.5 < s["delta_nll_ci"][1] < 2.0


def test_free_running_measures():
    """Acceptance ratio and copied 4-grams: dense against itself gives 1 and 0; the shares are counted right."""
    assert copied_share(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 3, 4, 5, 9])) == 0.5
    assert copied_share(torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2])) == 0.0
    model = make_model("llama")
    results = teacher_forced(
        model, [_window(0, prompt=120)], {"dense_again": None}, progress=False, free_running=8
    )
    s = results["dense_again"].summary()
    assert s["accept_ratio"] == 1.0 and s["copied_4gram_delta"] == 0.0


class _Letters:
    """A tokenizer stand-in: id 5 is a newline, id i otherwise the letter chr(92 + i)."""

    def decode(self, ids):
        return "".join("\n" if int(i) == 5 else chr(92 + int(i)) for i in ids)


def test_next_line_examples_cut_at_line_starts():
    ids = torch.tensor([7, 8, 5, 9, 9, 5, 5, 10, 11, 5, 12, 5, 13])
    examples = next_line_examples([ids], _Letters(), context=3, count=10, spacing=1)
    letters = _Letters()
    assert [line for _, line in examples] == [letters.decode([9, 9]), letters.decode([10, 11]),
                                              letters.decode([12])]  # fmt: skip
    assert all(prompt.numel() == 3 and int(prompt[-1]) == 5 for prompt, _ in examples)  # a line start each
    assert len(next_line_examples([ids], letters, context=3, count=10, spacing=5)) == 2


def test_next_line_task_pairs_lines_and_scores_them():
    """Dense verification twice gives the same lines (delta 0); the scores count what a plain greedy generate gives;
    edit similarity and the paired interval are right on known cases."""
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert edit_similarity("", "") == 1.0 and edit_similarity("ab", "") == 0.0
    assert paired_delta([1.0, 0.0, 1.0], [1.0, 0.0, 1.0]) == (0.0, [0.0, 0.0])
    model = make_model("llama")
    letters = _Letters()
    ids = torch.randint(6, 60, (400,), generator=torch.Generator().manual_seed(1))
    ids[::9] = 5
    examples = next_line_examples([ids], letters, context=64, count=6, spacing=20)
    result = next_line_task(model, letters, examples, {"dense": None, "again": None, "aggressive": AGGRESSIVE},
                            batch=4, new_tokens=6, progress=False)  # fmt: skip
    assert result["dense"]["per_line"] == result["again"]["per_line"] and result["dense"]["lines"] == 6
    assert len(result["aggressive"]["per_line"]) == 6
    expected = []
    for prompt, line in examples:
        out = model.generate(input_ids=prompt[None], max_new_tokens=6, do_sample=False)
        text = letters.decode(out[0, prompt.numel() :]).split("\n")[0].strip()
        expected.append((float(text == line.strip()), edit_similarity(text, line.strip())))
    assert result["dense"]["per_line"] == expected
