"""`benchmarks/bench_e2e.py` on the trained fixtures at tiny sizes (CPU, float32): the per-shape cases and the mixed
workload write records with the fields the plot and the results tables read; `benchmarks/plot_e2e.py` draws a
results file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
import torch

# the repository root, holding the benchmarks package
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import _records, bench_e2e, plot_e2e  # noqa: E402

pytestmark = pytest.mark.fixtures

SHAPE_FIELDS = {
    "device", "batch", "context", "new_tokens", "strategy", "k_policy", "decode_tokens_per_s", "call_tokens_per_s",
    "vs_k0", "vs_plain", "mean_acceptance_length", "steps", "draft_ms", "verify_ms", "update_ms", "capture_s",
    "first_capture_s", "machine", "setting",
}  # fmt: skip
MIXED_FIELDS = {
    "device", "shape", "strategy", "k_policy", "total_s", "calls", "vs_k0", "vs_plain", "capture_s",
    "first_capture_s", "per_call", "machine", "setting",
}  # fmt: skip


@pytest.fixture(scope="module")
def models(shared_models):
    return bench_e2e.load_models(shared_models.parent, "cpu", torch.float32)


def test_shape_cases_write_their_records(shared_models, tmp_path):
    out = tmp_path / "e2e.json"
    bench_e2e.main(["--shared", str(shared_models.parent), "--device", "cpu", "--shapes", "1x256", "--cases", "k0",
                    "prompt_lookup:4", "transformers", "--new-tokens", "8", "--json", str(out)])  # fmt: skip
    records = {r["setting"]: r for r in _records.records(out)}
    assert set(records) == {"cpu:1x256:k0", "cpu:1x256:prompt_lookup:4", "cpu:1x256:transformers"}
    for record in records.values():
        assert SHAPE_FIELDS <= set(record), SHAPE_FIELDS - set(record)
        assert (record["batch"], record["context"], record["new_tokens"]) == (1, 256, 8)
        assert record["capture_s"] == 0.0 and record["first_capture_s"] == 0.0  # CPU: no graphs
        assert {"commit", "torch", "transformers"} <= set(record["machine"])
    k0, lookup, plain = (records[f"cpu:1x256:{c}"] for c in ("k0", "prompt_lookup:4", "transformers"))
    assert k0["vs_k0"] == 1.0 and plain["vs_plain"] == 1.0
    assert (k0["strategy"], k0["k_policy"]) == ("k0", "plain")
    assert (lookup["strategy"], lookup["k_policy"], lookup["num_draft_tokens"]) == (
        "prompt_lookup",
        "constant",
        4,
    )
    assert (plain["strategy"], plain["k_policy"]) == ("transformers", None)
    assert lookup["vs_k0"] > 0 and lookup["vs_plain"] > 0 and lookup["mean_acceptance_length"] >= 1.0


def test_trace_holds_each_case_and_the_planner_profiles(shared_models, tmp_path):
    """``--trace``: each case's steps, and after each shape every cost profile `auto` measured (what its estimates
    were priced by)."""
    trace = tmp_path / "trace.json"
    bench_e2e.main(["--shared", str(shared_models.parent), "--device", "cpu", "--shapes", "1x256", "--cases", "auto",
                    "--new-tokens", "8", "--no-save", "--trace", str(trace)])  # fmt: skip
    traces = json.loads(trace.read_text())
    steps = traces["cpu:1x256:auto"]
    assert len(steps["members"]) == len(steps["step_parts_s"]) > 0
    # the process may hold other tests' profiles too: this call's is the one-row CPU entry with prompt lookup
    mine = [p for p in traces["profiles after 1x256"] if p["batch"] == 1 and "prompt_lookup" in p["members"]]
    assert mine and all(p["device"] == "cpu" for p in mine)
    assert any(p["profile"]["verify"] for p in mine), "the timed calls' verify seconds"


def test_mixed_sequence_is_fixed_and_varied(shared_models, models):
    tokenizer, _, _ = models
    path = shared_models / "prompts_long.jsonl"
    calls = bench_e2e.mixed_sequence(path, tokenizer, scale=0.01)
    again = bench_e2e.mixed_sequence(path, tokenizer, scale=0.01)
    assert len(calls) >= 12
    assert all(torch.equal(a["ids"], b["ids"]) for a, b in zip(calls, again))
    assert {c["batch"] for c in calls} == {1, 4, 16}
    assert {c["content"] for c in calls} == {"copy", "fresh", "random", "mix"}
    assert len({c["context"] for c in calls}) >= 4
    for call in calls:
        assert call["ids"].shape == (call["batch"], call["context"])
        if call["content"] == "copy":  # the prompt ends with its own beginning again
            m = max(4, call["context"] // 8)
            assert torch.equal(call["ids"][:, -m:], call["ids"][:, :m])
        if call["content"] == "random":
            assert not (call["ids"] == tokenizer.eos_token_id).any()
    full = bench_e2e.mixed_sequence(path, tokenizer)
    assert max(c["context"] for c in full) == 16384 and min(c["context"] for c in full) == 1024


def test_random_prompts_are_seeded_and_have_no_eos(shared_models, models):
    tokenizer = models[0]
    path = shared_models / "prompts_long.jsonl"
    ids = bench_e2e.prompts(path, tokenizer, 3, 64, "cpu", content="random")
    assert ids.shape == (3, 64) and not (ids == tokenizer.eos_token_id).any()
    assert torch.equal(ids, bench_e2e.prompts(path, tokenizer, 3, 64, "cpu", content="random"))
    assert not torch.equal(ids, bench_e2e.prompts(path, tokenizer, 3, 64, "cpu"))


def test_mixed_workload_records(shared_models, models, tmp_path):
    tokenizer, target, draft = models
    calls = bench_e2e.mixed_sequence(shared_models / "prompts_long.jsonl", tokenizer, scale=0.005)
    # the CPU budget: each content once at batch 1, and a batch of 4 mixing copy and fresh rows
    kinds = [("fresh", 1), ("copy", 1), ("random", 1), ("mix", 4)]
    calls = [next(c for c in calls if (c["content"], c["batch"]) == kind) for kind in kinds]
    args = argparse.Namespace(json=str(tmp_path / "e2e.json"), setting=None, no_save=False, benchmark="e2e")
    saved = []  # as each case is measured, plain generate last
    cases = ["transformers", "k0", "prompt_lookup:4"]
    for setting, record in bench_e2e.run_mixed(
        target, draft, calls, cases, "cpu", 0.005, save=lambda setting, record: saved.append(setting)
    ):
        _records.save(args, record, "cpu", setting=setting)
    assert saved == ["cpu:mixed:k0", "cpu:mixed:prompt_lookup:4", "cpu:mixed:transformers"]
    records = {r["setting"]: r for r in _records.records(args.json)}
    assert set(records) == {"cpu:mixed:k0", "cpu:mixed:prompt_lookup:4", "cpu:mixed:transformers"}
    for record in records.values():
        assert MIXED_FIELDS <= set(record), MIXED_FIELDS - set(record)
        assert record["shape"] == "mixed" and record["calls"] == len(calls) == len(record["per_call"])
        assert record["total_s"] == pytest.approx(sum(c["wall_s"] for c in record["per_call"]))
        assert record["vs_k0"] == pytest.approx(records["cpu:mixed:k0"]["total_s"] / record["total_s"])
    assert records["cpu:mixed:k0"]["vs_k0"] == 1.0
    assert records["cpu:mixed:prompt_lookup:4"]["k_policy"] == "constant"
    assert "vs_best_fixed" not in records["cpu:mixed:k0"]  # only auto is compared with the best fixed case


def test_per_call_oracle_takes_each_call_s_fastest_case():
    """The mixed workload's floor for a per-call choice: each call by its fastest fixed case."""
    fast_first = {"per_call": [{"wall_s": 1.0}, {"wall_s": 5.0}, {"wall_s": 2.0}]}
    fast_second = {"per_call": [{"wall_s": 3.0}, {"wall_s": 1.0}, {"wall_s": 2.5}]}
    assert bench_e2e.per_call_oracle([fast_first, fast_second]) == pytest.approx(4.0)
    assert bench_e2e.per_call_oracle([fast_first]) == pytest.approx(8.0)
    with pytest.raises(ValueError, match="different numbers of calls"):
        bench_e2e.per_call_oracle([fast_first, {"per_call": [{"wall_s": 1.0}]}])


def test_plot_draws_shapes_and_mixed(tmp_path):
    machine = dict(date="2026-11-28 10:00:00 UTC", torch="2", transformers="5", commit="c0ffee")
    records = [
        dict(setting=f"cuda:{shape}:{case}", device="GPU X", shape=shape, vs_k0=v, machine=machine)
        for shape in ("1x4096", "16x16384") for case, v in (("k0", 1.0), ("prompt_lookup:4", 1.3), ("auto", 1.5))
    ] + [
        dict(setting=f"cuda:mixed:{case}", device="GPU X", shape="mixed", total_s=t, vs_k0=10.0 / t, calls=15,
             mixed_scale=1.0, machine=machine)
        for case, t in (("k0", 10.0), ("prompt_lookup:4", 8.0), ("auto", 7.0), ("transformers", 20.0))
    ] + [dict(setting="cpu:1x256:k0", device="cpu", shape="1x256", vs_k0=1.0,
              machine=dict(machine, date="2026-11-01 10:00:00 UTC"))]  # fmt: skip
    results = tmp_path / "e2e.json"
    results.write_text(json.dumps(dict(benchmark="e2e", description="", records=records)))
    assert plot_e2e.latest_device(records) == "GPU X"
    out = plot_e2e.main(["--results", str(results), "--out", str(tmp_path / "e2e.png")])
    assert out.stat().st_size > 0
    assert plot_e2e.main(["--results", str(results), "--device", "cpu"]) == results.with_suffix(".png")
    assert results.with_suffix(".png").stat().st_size > 0


def test_timed_calls_of_the_cases_are_interleaved(monkeypatch):
    """Every case's warm-up first, then rounds of one timed call per case, each round starting one case later; each
    record keeps its own timed calls."""
    from types import SimpleNamespace

    order = []

    def fake_call(parsed, target, draft, ids, new_tokens, device):
        order.append(parsed["case"])
        wall = 1.0 + len(order)  # each later call slower: a drift
        stats = SimpleNamespace(
            wall_time_s=wall, prefill_time_s=0.1, graph_capture_s=0.0, new_tokens=[9], steps=4,
            mean_acceptance_length=2.0, draft_time_s=0.1, verify_time_s=0.2, update_time_s=0.1, loop_time_s=wall,
            between_steps_s=0.0, policy_time_s=0.0, chosen=None, members=[], draft_tokens=[], accepted_tokens=[],
            proposed_tokens=[], step_parts_s=[], policy_states=[],
        )  # fmt: skip
        return SimpleNamespace(speculation=stats), wall

    real_parse = bench_e2e.parse_case
    monkeypatch.setattr(bench_e2e, "parse_case", lambda case: {**real_parse(case), "case": case})
    monkeypatch.setattr(bench_e2e, "_call", fake_call)
    cases = ["k0", "prompt_lookup:4", "auto"]
    records = bench_e2e.run_cases(cases, None, None, None, 8, "cpu", repeats=3)
    assert order == [*cases, *cases, "prompt_lookup:4", "auto", "k0", "auto", "k0", "prompt_lookup:4"]
    for case, calls in (("k0", (4, 9, 11)), ("auto", (6, 8, 10))):
        rates = records[case]["decode_tokens_per_s_all"]
        assert rates == [8 / (1.0 + n - 0.1) for n in calls]
