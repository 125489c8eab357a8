"""`hf-sparse-verify tune`: the three-step search as a pure function, and a CPU smoke test of the command."""

from __future__ import annotations

import doctest
import json
import random

import pytest
from conftest import char_tokenizer, make_model

from hf_sparse_verify import SpeculationConfig, cli
from hf_sparse_verify.drivers import tune
from hf_sparse_verify.drivers.tune import STEP_NAMES, Measurement, refine_candidates, three_step_search


def synthetic(saturate_at: float = 0.1, best_k: int = 6):
    """Acceptance rising until ``saturate_at`` then flat; tokens/s peaking at ``best_k`` and, at that K, falling
    with the ratio below ``saturate_at`` (cheaper drafts do not pay for the lost acceptance) and above it."""
    calls: list[tuple[float, int]] = []

    def measure(ratio: float, k: int) -> Measurement:
        calls.append((ratio, k))
        acceptance = 1.0 + 4.0 * min(ratio, saturate_at) / saturate_at
        speed = 100.0 - 5.0 * abs(k - best_k) - 50.0 * abs(ratio - saturate_at)
        return Measurement(ratio, k, acceptance, speed)

    return measure, calls


def test_step1_stops_where_acceptance_saturates():
    measure, calls = synthetic(saturate_at=0.1, best_k=6)
    result = three_step_search(
        measure, ratios=[0.2, 0.02, 0.05, 0.1, 0.3], ks=[2, 4, 6, 8], k_large=8, refine_factors=(0.5, 1.5)
    )
    assert result.ratio_step1 == 0.1
    # step 1 measured ascending and stopped at the first flat point (0.2); 0.3 was never run
    assert [m.ratio for m in result.steps[STEP_NAMES[0]]] == [0.02, 0.05, 0.1, 0.2]
    assert (0.3, 8) not in calls
    assert result.k == 6
    assert [m.k for m in result.steps[STEP_NAMES[1]]] == [2, 4, 6, 8]
    assert result.ratio == 0.1
    assert [m.ratio for m in result.steps[STEP_NAMES[2]]] == [0.05, 0.1, 0.15]
    # every point once: (0.1, 8) is shared by steps 1 and 2, (0.1, 6) by steps 2 and 3
    assert len(calls) == len(set(calls)) == 4 + 3 + 2


def test_step1_keeps_the_largest_ratio_while_acceptance_rises():
    measure, _ = synthetic(saturate_at=0.5, best_k=3)
    result = three_step_search(measure, ratios=[0.05, 0.1, 0.2], ks=[2, 3, 4], k_large=8)
    assert result.ratio_step1 == 0.2
    assert result.k == 3


def test_step3_can_move_the_ratio():
    def measure(ratio, k):  # flat acceptance; at K=4 the smallest ratio is the fastest
        return Measurement(ratio, k, 3.0, 100.0 - k - 10.0 * ratio)

    result = three_step_search(measure, ratios=[0.04, 0.08], ks=[4, 5], k_large=8, refine_factors=(0.5, 1.5))
    assert result.ratio_step1 == 0.04
    assert result.k == 4
    assert result.ratio == 0.02


def test_ties_pick_the_smaller_k():
    result = three_step_search(
        lambda r, k: Measurement(r, k, 2.0, 50.0), ratios=[0.1], ks=[8, 2, 4], k_large=8
    )
    assert result.k == 2


def test_refine_candidates_stay_in_range():
    assert refine_candidates(0.8, (0.5, 1.5)) == [0.4, 0.8]
    assert refine_candidates(0.07) == [0.035, 0.0525, 0.07, 0.0875, 0.105]


@pytest.mark.parametrize("bad", [dict(ratios=[]), dict(ks=[]), dict(ratios=[0.0, 0.1]), dict(ks=[0, 2])])
def test_bad_sweeps(bad):
    measure, _ = synthetic()
    with pytest.raises(ValueError):
        three_step_search(measure, **{"ratios": [0.1], "ks": [2], **bad})


def test_progress_total_tracks_the_points_measured():
    class Bar:
        n, total = 0, None

        def update(self, k):
            self.n += k

        def refresh(self):
            pass

        def set_postfix_str(self, s):
            pass

    bar = Bar()
    measure, calls = synthetic()
    three_step_search(
        measure, ratios=[0.05, 0.1, 0.2, 0.4], ks=[4, 6], k_large=8, refine_factors=(0.5,), progress=bar
    )
    assert bar.n == bar.total == len(calls)


def test_doctests():
    assert doctest.testmod(tune).failed == 0


def test_measure_generate_sums_over_prompts():
    import torch

    from hf_sparse_verify.drivers.tune import measure_generate

    model = make_model("llama")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40, (1, 60), generator=gen) for _ in range(2)]
    base = SpeculationConfig(strategy="vegas", min_tokens=4)
    # 5 new tokens with K = 4: the last step's K is cut to the tokens left, the point keeps K = 4
    m = measure_generate(model, prompts, base, max_new_tokens=5)(0.2, 4)
    assert (m.ratio, m.k) == (0.2, 4)
    assert m.details["prompts"] == 2
    assert m.details["decode_tokens"] == 2 * 4
    events, accepted = m.details["drafting_events"], m.details["accepted_drafts"]
    assert events >= 2 and m.mean_acceptance_length == pytest.approx(1 + accepted / events)
    assert m.tokens_per_second > 0


def test_tune_command_on_a_tiny_model(tmp_path, capsys):
    model_dir = tmp_path / "model"
    make_model("llama").save_pretrained(model_dir)
    char_tokenizer().save_pretrained(model_dir)
    chars = [chr(c) for c in range(ord("!"), ord("!") + 93)]
    rng = random.Random(0)
    prompt_file = tmp_path / "prompts.jsonl"
    with open(prompt_file, "w") as f:
        for _ in range(2):
            f.write(json.dumps({"text": "".join(rng.choice(chars[:20]) for _ in range(96))}) + "\n")
    out = tmp_path / "tuned"
    ratios, ks = [0.1, 0.3], [2, 3]
    code = cli.main(
        [
            "tune",
            "--strategy",
            "vegas",
            "--model",
            str(model_dir),
            "--prompt-file",
            str(prompt_file),
            "--device",
            "cpu",
            "--max-new-tokens",
            "8",
            "--ratios",
            *map(str, ratios),
            "--ks",
            *map(str, ks),
            "--k-large",
            "3",
            "--refine-factors",
            "0.5",
            "--min-tokens",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    config = SpeculationConfig.from_pretrained(out)
    record = json.loads((out / "tune_measurements.json").read_text())
    assert config.strategy == "vegas"
    assert config.num_draft_tokens in ks
    assert config.ratio in ratios + [r * 0.5 for r in ratios]
    assert config.min_tokens == 4
    assert list(record["steps"]) == list(STEP_NAMES)
    assert all(record["steps"][name] for name in STEP_NAMES)
    assert [m["k"] for m in record["steps"][STEP_NAMES[1]]] == ks
    assert {m["k"] for m in record["steps"][STEP_NAMES[0]]} == {3}
    assert record["steps"][STEP_NAMES[0]][0]["details"]["prompts"] == 2
    assert record["meta"]["prompt_tokens"] == [96, 96]
    assert (out / "tune_sweep.png").stat().st_size > 0
    assert "best: ratio=" in capsys.readouterr().out


def test_tune_rejects_strategies_without_a_ratio(tmp_path, capsys):
    status = cli.main(["tune", "--strategy", "prompt_lookup", "--prompt-file", str(tmp_path / "x.txt")])
    assert status == 2
    assert (
        "--strategy prompt_lookup has no KV-selection ratio to tune: use one of ['quest', 'streaming', 'vegas']"
        in capsys.readouterr().err
    )
