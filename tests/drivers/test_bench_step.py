"""``hf-sparse-verify bench step`` end to end on a tiny preset (CPU: eager steps, no floor), and its bad input."""

from __future__ import annotations

import json

import pytest

from hf_sparse_verify.cli import main
from hf_sparse_verify.drivers.shapes import (
    SHAPES,
    expected_experts,
    random_model,
    shape_config,
    weight_bytes_per_step,
)


def test_bench_step_writes_records(tmp_path):
    out = tmp_path / "step.json"
    argv = [
        "bench",
        "step",
        "--shape",
        "tiny-llama",
        "--context",
        "40,70",
        "--new-tokens",
        "1,3",
        "--device",
        "cpu",
    ]
    assert main([*argv, "--dtype", "float32", "--repeats", "2", "--vegas-scores", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["shape"] == "tiny-llama" and result["machine"]["torch"]
    records = result["records"]
    assert [(r["context"], r["new_tokens"]) for r in records] == [(40, 1), (40, 3), (70, 1), (70, 3)]
    for r in records:
        assert r["ours_ms"] > 0 and r["transformers_ms"] > 0 and r["ours_vegas_scores_ms"] > 0
        assert r["floor_ms"] is None  # no copy bandwidth measured on CPU


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "tiny-llama", "--new-tokens", "0"], "new-tokens takes values in 1..32"),
        (["--shape", "tiny-llama", "--context", "0"], "context needs positive"),
        (["--shape", "tiny-llama", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    ],
)
def test_bench_step_bad_input(argv, message, capsys):
    try:
        status = main(["bench", "step", "--device", "cpu", *argv])
    except SystemExit as exit:  # argparse's own checks
        status = exit.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and len(err.splitlines()) == 1, err


def test_shape_presets_build_and_count_bytes():
    assert {"llama-3.1-8b", "qwen3-30b-a3b"} <= set(SHAPES)
    config = shape_config("llama-3.1-8b")
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (4096, 32, 8)
    model = random_model("tiny-qwen3-moe", "cpu", __import__("torch").float32)
    # one token reads top_k experts per layer; more tokens read the distinct experts a uniform router touches
    experts, top_k = model.config.num_experts, model.config.num_experts_per_tok
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n and p.dim() == 3)
    row = model.config.hidden_size * 4  # one float32 embedding row
    dense = weight_bytes_per_step(model, 1, 1) - row - 4 * expert_params * top_k // experts
    for tokens in (1, 2, 16, 64):
        share = expected_experts(experts, top_k, tokens) / experts
        want = dense + tokens * row + 4 * expert_params * share
        assert abs(weight_bytes_per_step(model, tokens, 1) - want) <= 4 * model.config.num_hidden_layers
    # a batch of rows counts its tokens like one row's: 4 x 4 tokens touch what 16 do
    assert weight_bytes_per_step(model, 4, 4) == weight_bytes_per_step(model, 16, 1)
    # a uniform router almost surely touches all 8 experts with 64 tokens; 4 tokens leave about 2.5 untouched
    assert (
        expected_experts(experts, top_k, 4)
        < experts - 2
        < experts - 0.01
        < expected_experts(experts, top_k, 64)
    )
    with pytest.raises(ValueError, match="unknown shape"):
        shape_config("llama-5")


def test_sync_counter_attributes_syncs_to_library_frames_only():
    """`count_syncs` counts a synchronisation only when a library frame (outside the bench harness) is on its
    stack: transformers' own per-call syncs in ``generate`` are not the library's."""
    import traceback

    from hf_sparse_verify.drivers.syncs import _ours

    def frame(path, line=1):
        return traceback.FrameSummary(path, line, "f")

    loop = frame("/x/hf_sparse_verify/generation/engine/loop.py", 170)
    harness = frame("/x/hf_sparse_verify/drivers/syncs.py", 40)
    theirs = frame("/venv/transformers/generation/utils.py", 99)
    assert _ours([harness, loop, theirs]) is loop
    assert _ours([harness, theirs]) is None
    assert _ours([frame("/x/tests/test_spine_gpu.py"), theirs]) is None
