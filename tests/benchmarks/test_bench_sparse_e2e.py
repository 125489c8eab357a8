"""`benchmarks/bench_sparse_e2e.py`: a lossy case against its dense twin (speed per call and per step), its class
from the quality records at the shape's context bucket, and `bench_e2e`'s ``+SETTING`` case suffix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, holding the benchmarks package
from benchmarks.bench_e2e import parse_case  # noqa: E402
from benchmarks.bench_sparse_e2e import quality_class, sparse_records, step_ms  # noqa: E402

QUALITY = [
    {"setting": "default", "model": "code-target", "context": 8192, "class": "balanced"},
    {"setting": "default", "model": "code-target", "context": 16384, "class": "near_exact"},
    {"setting": "default", "model": "code-moe", "context": 4096, "class": "fast"},  # another model: ignored
    {"setting": "attn_shared", "model": "code-target", "context": 16384, "class": "fast"},
]


def test_class_comes_from_the_context_bucket():
    assert quality_class("default", 4096, QUALITY) == ("balanced", 8192)
    assert quality_class("default", 8192, QUALITY) == ("balanced", 8192)
    assert quality_class("default", 12288, QUALITY) == ("near_exact", 16384)
    assert quality_class("default", 32768, QUALITY) == ("near_exact", 16384)  # beyond: the largest graded
    assert quality_class("attn_rho0.7", 8192, QUALITY) == ("ungraded", None)


def _e2e(lossy, tokens_per_s, steps, wall, acceptance):
    return dict(
        strategy="prompt_lookup", k_policy="constant", num_draft_tokens=4, lossy=lossy, batch=16, context=16384,
        new_tokens=256, decode_tokens_per_s=tokens_per_s, mean_acceptance_length=acceptance, verify_ms=0.9,
        draft_ms=0.1, steps=steps, decode_tokens_per_s_all=[tokens_per_s], vs_k0=1.5, device="gpu",
        wall_s=wall, prefill_s=0.1, capture_s=0.0,
    )  # fmt: skip


def test_lossy_case_is_compared_with_its_dense_twin():
    dense = _e2e(None, 100.0, 100, 0.3, 3.5)  # 2.0 ms per step
    lossy = _e2e("default", 150.0, 80, 0.26, 4.0)  # 2.0 ms per step: fewer steps, not faster ones
    out = sparse_records([("gpu:16x16384:prompt_lookup:4", dense), ("gpu:16x16384:prompt_lookup:4+default", lossy)],
                         QUALITY)  # fmt: skip
    assert [key for key, _ in out] == ["gpu:16x16384:prompt_lookup:4+default"]
    record = out[0][1]
    assert record["vs_dense"] == pytest.approx(1.5)
    assert step_ms(dense) == pytest.approx(2.0) and step_ms(lossy) == pytest.approx(2.0)
    assert record["vs_dense_per_step"] == pytest.approx(1.0)
    assert record["class"] == "near_exact" and record["class_context"] == 16384
    assert record["setting_detail"]["attention"]["schedule"] == "shared_window"


def test_lossy_case_without_its_twin_is_an_error():
    with pytest.raises(SystemExit, match="dense twin"):
        sparse_records([("gpu:16x16384:draft_model:4+default", _e2e("default", 150.0, 80, 0.26, 4.0))], QUALITY)


def test_case_suffix_names_a_measured_setting():
    parsed = parse_case("prompt_lookup:4+attn_rho0.7")
    assert parsed["lossy"] == "attn_rho0.7" and parsed["num_draft_tokens"] == 4
    assert parsed["speculation"]["lossy_sparse_verify"]["attention"]["rho"] == 0.7
    assert parse_case("prompt_lookup:4")["lossy"] is None
    with pytest.raises(SystemExit, match="unknown lossy setting"):
        parse_case("prompt_lookup:4+rho0.2")
    with pytest.raises(SystemExit, match="needs a drafting strategy"):
        parse_case("k0+default")


def test_plot_draws_every_case(tmp_path):
    from benchmarks.bench_sparse_e2e import plot

    dense = _e2e(None, 100.0, 100, 0.3, 3.5)
    records = [r for _, r in sparse_records([("a", dense), ("a+default", _e2e("default", 150.0, 80, 0.26, 4.0))],
                                            QUALITY)]  # fmt: skip
    records.append(dict(records[0], vs_dense_per_step=None, run="older"))  # a run without the per-step columns
    out = tmp_path / "e2e.png"
    assert plot(records, str(out)) == str(out)
    assert out.stat().st_size > 10_000
