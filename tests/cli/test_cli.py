"""The CLI answers every mistake with exit status 2 and one line saying what to change (no traceback unless
--debug), checked before any model loads where it can be; --help documents every choice and default.

Most cases call `hf_sparse_verify.cli.main` in-process (a subprocess costs seconds of imports); one subprocess
checks the real exit status and stderr of the installed entry point.
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_sparse_verify
import hf_sparse_verify.cli
from hf_sparse_verify.cli import main

TARGET = os.path.join(hf_sparse_verify.default_model_path(), "target")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(hf_sparse_verify.__file__)))


@pytest.fixture(autouse=True)
def one_thread():
    """The demo models are tiny: one thread is fastest and avoids oversubscribing a shared CI machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if the CLI loads a model or tokenizer: the mistake must be caught before that."""

    def load(*args, **kwargs):
        raise AssertionError("the CLI loaded a model before checking its arguments")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", load)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        status = main(argv)
    except SystemExit as exit:  # argparse's own errors
        status = exit.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _assert_one_line_error(status: int, err: str, message: str) -> None:
    assert status == 2
    assert "Traceback" not in err
    # transformers' "Loading weights" progress bar (carriage returns, then a newline) may come first
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("hf-sparse-verify"), lines[0]
    assert ": error: " in lines[0], lines[0]
    assert message in lines[0], lines[0]


# ------------------------------------------------------------------------------ mistakes caught before loading
JSONL_BAD_LINE_2 = '{"text": "def f():"}\n{"text": oops}\n'
BEFORE_LOADING = [
    # (argv, {file name: content}, part of the message)
    (["--prompt-file", "nope.jsonl"], {}, "--prompt-file 'nope.jsonl': no such file"),
    (["--prompt-file", "p.jsonl"], {"p.jsonl": JSONL_BAD_LINE_2}, "'p.jsonl' line 2: not valid JSON"),
    (["--prompt-file", "p.jsonl"], {"p.jsonl": '{"prompt": "x"}\n'}, 'line 1 has no "text" field'),
    (["--prompt-file", "p.jsonl"], {"p.jsonl": '{"text": ""}\n'}, '"text" must be a non-empty string'),
    (["--prompt-file", "p.txt"], {"p.txt": ""}, "'p.txt' is empty: write the prompt into it"),
    (["--prompt-file", "p.jsonl"], {"p.jsonl": "\n\n"}, "'p.jsonl' holds no prompts"),
    (["--prompt-file", "."], {}, "is a folder: give a text file or a .jsonl file"),
    (["--prompt-file", "p.txt"], {"p.txt": b"\xff\xfe\x00bad"}, "is not UTF-8 text"),
    (["--dtype", "float64x"], {}, "argument --dtype: invalid choice: 'float64x' (choose from"),
    (["--prompt", ""], {}, "--prompt is empty: give some text"),
    (["--prompt", "   "], {}, "--prompt is empty"),
    (["--strategy", "medusa"], {}, "argument --strategy: invalid choice: 'medusa'"),
    (["--k-policy", "dynamic"], {}, "argument --k-policy: invalid choice: 'dynamic'"),
    (["--model", "./no/such/model"], {}, "--model './no/such/model': folder not found"),
    (["--model", "/no/such/model"], {}, "--model '/no/such/model': folder not found"),
    (["--model", "."], {}, "--model '.' holds no config.json"),
    (["--draft-model", "./no/such/draft"], {}, "--draft-model './no/such/draft': folder not found"),
    (["--temperature", "0.7"], {}, "--temperature needs --do-sample"),
    (["--top-k", "5", "--top-p", "0.9"], {}, "--top-k, --top-p need --do-sample"),
    (["--top-p", "1.5", "--do-sample"], {}, "argument --top-p: expected a number in (0, 1], got '1.5'"),
    (["--temperature", "0", "--do-sample"], {}, "argument --temperature: expected a number > 0"),
    (["--max-new-tokens", "0"], {}, "argument --max-new-tokens: expected a whole number >= 1, got '0'"),
    (["--max-new-tokens", "ten"], {}, "argument --max-new-tokens: expected a whole number, got 'ten'"),
    (["--num-draft-tokens", "0"], {}, "--num-draft-tokens 0 with --k-policy constant never drafts"),
    (["--num-draft-tokens", "99"], {}, "--num-draft-tokens must be in 0..16, got 99"),
    (
        ["--strategy", "vegas", "--draft-model", TARGET],
        {},
        "--draft-model is used only by --strategy draft_model",
    ),
    (["--strategy", "draft_model", "--model", TARGET], {}, "--strategy draft_model needs --draft-model"),
    (["--device", "gpu"], {}, "--device 'gpu' is not a device: use cpu, cuda or cuda:N"),
    (["--json", "no/such/folder/out.json"], {}, "does not exist; create it or pick another path"),
    (
        ["--prompt", "a", "--prompt-file", "p.txt"],
        {},
        "argument --prompt-file: not allowed with argument --prompt",
    ),
]


@pytest.mark.parametrize("argv, files, message", BEFORE_LOADING, ids=[" ".join(c[0]) for c in BEFORE_LOADING])
def test_generate_mistake_is_one_line_before_loading(
    argv, files, message, tmp_path, monkeypatch, capsys, no_model_loads
):
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    status, out, err = _run(["generate", *argv], capsys)
    _assert_one_line_error(status, err, message)
    assert out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_device_without_cuda(capsys, no_model_loads):
    status, _, err = _run(["generate", "--device", "cuda"], capsys)
    _assert_one_line_error(status, err, "sees no CUDA GPU; use --device cpu")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tune", "--prompt-file", "nope.txt"], "--prompt-file 'nope.txt': no such file"),
        (["tune", "--prompt-file", "p.jsonl"], "'p.jsonl' line 2: not valid JSON"),
        (
            ["tune", "--prompt-file", "p.jsonl", "--prompt-len", "999"],
            "no prompts in p.jsonl with len == 999",
        ),
        (
            ["tune", "--prompt-file", "p.jsonl", "--strategy", "draft_model"],
            "--strategy draft_model has no KV-selection ratio to tune: use one of ['quest', 'streaming', 'vegas']",
        ),
        (["tune"], "the following arguments are required: --prompt-file"),
        (
            ["tune", "--prompt-file", "p.jsonl", "--prompt-len", "1", "--draft-model", "org/draft"],
            "--draft-model: vegas drafts with the target itself; drop --draft-model",
        ),
        (["bench", "step", "--shape", "gpt-5"], "--shape 'gpt-5' is not a preset: use one of ["),
        (
            ["bench", "step", "--shape", "tiny-llama", "--new-tokens", "40"],
            "--new-tokens takes values in 1..32",
        ),
        (
            ["frobnicate"],
            "invalid choice: 'frobnicate' (choose from 'generate', 'tune', 'calibrate', 'bench')",
        ),
    ],
)
def test_tune_and_bench_mistakes_are_one_line(argv, message, tmp_path, monkeypatch, capsys, no_model_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text(
        '{"text": "x", "len": 1}\n' if "--prompt-len" in argv else JSONL_BAD_LINE_2
    )
    status, _, err = _run(argv, capsys)
    _assert_one_line_error(status, err, message)


def test_debug_shows_the_traceback(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(hf_sparse_verify.cli.UsageError, match="no such file"):
        main(["generate", "--prompt-file", "nope.jsonl", "--debug"])


# ------------------------------------------------------------------------------ mistakes found while loading
def test_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"hello": "world"}))
    status, _, err = _run(["generate", "--model", str(tmp_path)], capsys)
    _assert_one_line_error(status, err, f"--model {str(tmp_path)!r} could not be loaded:")


def test_prompt_longer_than_the_model(tmp_path, capsys):
    """The library's own checks (here: 4096 positions) come out as one line too."""
    prompt = tmp_path / "long.txt"
    prompt.write_text("x = 1\n" * 3000)
    status, _, err = _run(["generate", "--prompt-file", str(prompt), "--strategy", "prompt_lookup"], capsys)
    _assert_one_line_error(status, err, "but the model has 4096 positions: shorten the prompt")


# ---------------------------------------------------------------------------------------------- good runs
def test_sampling_says_outputs_are_not_expected_to_match(tmp_path, capsys):
    out_json = tmp_path / "out.json"
    argv = ["generate", "--do-sample", "--temperature", "0.8", "--compare-plain", "--max-new-tokens", "6"]
    status, out, err = _run([*argv, "--device", "cpu", "--json", str(out_json)], capsys)
    assert status == 0, err
    assert "outputs are not expected to match" in err
    assert "identical output" not in err
    record = json.loads(out_json.read_text())
    assert record["plain"]["expected_identical"] is False
    assert out.startswith("class Stack:")


def test_greedy_compare_plain_reports_identical(tmp_path, capsys):
    status, _, err = _run(
        [
            "generate",
            "--strategy",
            "prompt_lookup",
            "--compare-plain",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
        ],
        capsys,
    )
    assert status == 0, err
    assert "identical output: True" in err


def test_compare_plain_times_warm_calls_of_both(tmp_path, capsys):
    """--compare-plain compares medians of --repeats warm calls of each (and says so); --repeats 0 the first
    calls; a negative count is refused."""
    out_json = tmp_path / "out.json"
    argv = ["generate", "--strategy", "prompt_lookup", "--compare-plain", "--max-new-tokens", "6", "--device", "cpu"]
    status, _, err = _run([*argv, "--repeats", "2", "--json", str(out_json)], capsys)
    assert status == 0, err
    assert "(median of 2 warm calls each); the first speculative call:" in err
    plain = json.loads(out_json.read_text())["plain"]
    assert plain["repeats"] == 2 and plain["identical"] is True
    assert plain["speculative_tokens_per_second"] > 0 and plain["tokens_per_second"] > 0
    status, _, err = _run([*argv, "--repeats", "0"], capsys)
    assert status == 0 and "(first calls)" in err, err
    status, _, err = _run([*argv, "--repeats", "-1"], capsys)
    _assert_one_line_error(status, err, "--repeats must be 0 or more")


def test_generate_help_documents_every_choice_and_default(capsys):
    status, out, _ = _run(["generate", "--help"], capsys)
    assert status == 0
    for name in ["auto", "prompt_lookup", "draft_model", "vegas", "streaming", "quest"]:
        assert f"\n  {name} " in out, name  # one row of the strategies table each
    for name in ["constant", "heuristic", "utility", "plain"]:
        assert f"\n  {name} " in out, name
    for flag, default in [
        ("--max-new-tokens", "(default: 64)"),
        ("--seed", "(default: 0)"),
        ("--num-draft-tokens", "(default: 4)"),
        ("--do-sample", "(default: greedy"),
        ("--temperature", "needs --do-sample"),
        ("--top-k", "needs --do-sample"),
        ("--top-p", "needs --do-sample"),
        ("--repetition-penalty", "(default: none)"),
    ]:
        assert flag in out and default in out, flag


def test_top_level_help_names_every_command_without_markup(capsys):
    status, out, _ = _run(["--help"], capsys)
    assert status == 0
    assert "``" not in out and ":func:" not in out
    for command in ["generate", "tune", "bench step"]:
        assert f"hf-sparse-verify {command}" in out


def test_docstring_examples():
    import hf_sparse_verify.cli._common as common

    results = [doctest.testmod(module) for module in (hf_sparse_verify.cli, common)]
    assert sum(r.attempted for r in results) >= 2 and sum(r.failed for r in results) == 0


def test_entry_point_process_exits_2_without_traceback(tmp_path):
    """The real process: exit status 2, one line on stderr, nothing loaded (the issue's example failed only after
    both models had loaded)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hf_sparse_verify.cli", "generate", "--prompt-file", "nope.jsonl"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == "hf-sparse-verify generate: error: --prompt-file 'nope.jsonl': no such file\n"
    assert proc.stdout == ""


def test_calibrate_writes_a_loadable_calibration(tmp_path, capsys):
    from hf_sparse_verify.sparse import SparseFFN
    from hf_sparse_verify.sparse.calibration import SparseCalibration

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "cal"
    argv = [
        "calibrate",
        "--prompt-file",
        str(prompts),
        "--out",
        str(out),
        "--max-tokens",
        "200",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    calibration = SparseCalibration.load(out)
    assert len(calibration.attention["similarity"]) == calibration.num_layers
    taus = calibration.ffn_thresholds(SparseFFN(sparsity=0.5))
    assert len(taus) == calibration.num_layers and all(t is None or t >= 0 for t in taus)
    assert "saved" in capsys.readouterr().out


def test_calibrate_grade_writes_classes_the_generate_call_honours(tmp_path, capsys):
    """``--grade`` grades the attention settings at --rho, 0.3, 0.5 and 0.7 (at --rho and 0.3 window-scored first)
    on each prompt's last tokens and writes their classes; the demo target with ``precision="near_exact"`` and that
    calibration then runs the first near_exact grade, or stays exact."""
    from hf_sparse_verify.sparse.calibration import SparseCalibration

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "cal"
    argv = ["calibrate", "--prompt-file", str(prompts), "--out", str(out), "--max-tokens", "200", "--device", "cpu",
            "--no-ffn", "--grade", "--grade-tokens", "24", "--block-size", "16", "--dense-below", "32",
            "--rho", "0.1"]  # fmt: skip
    assert main(argv) == 0
    calibration = SparseCalibration.load(out)
    assert [(g["setting"]["attention"]["rho"], g["setting"]["attention"]["schedule"]) for g in calibration.grades] == [
        (0.1, "shared_window"), (0.1, "shared"), (0.3, "shared_window"), (0.3, "shared"), (0.5, "shared"),
        (0.7, "shared"),
    ]  # fmt: skip
    for g in calibration.grades:
        assert g["class"] in ("near_exact", "balanced", "fast") and g["measures"]["positions"] == 23
        # balanced needs the acceptance ratio and the task score, which --grade does not measure here
        assert g["class"] != "balanced"
    printed = capsys.readouterr().out
    assert "grade attention rho 0.1:" in printed and "quality_calibration" in printed
    near = [g["setting"]["attention"]["rho"] for g in calibration.grades if g["class"] == "near_exact"]
    granted = calibration.granted("near_exact")
    assert (granted is None and not near) or granted.attention.rho == near[0]


def test_calibrate_mistakes_are_one_line(tmp_path, capsys):
    assert main(["calibrate", "--prompt-file", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-sparse-verify calibrate: error:") and "\n" not in err


def test_calibrate_row_union_on_the_moe_fixture(tmp_path, capsys, shared_models):
    """``--moe-rule row_union`` measures that setting's damage (rows of --verify-tokens tokens) and records it."""
    from hf_sparse_verify.sparse.calibration import SparseCalibration

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n    return a + b\n" * 40)
    out = tmp_path / "cal"
    argv = [
        "calibrate",
        "--model",
        str(shared_models / "code-moe"),
        "--prompt-file",
        str(prompts),
        "--out",
        str(out),
    ]
    argv += [
        "--max-tokens",
        "200",
        "--device",
        "cpu",
        "--no-ffn",
        "--moe-rule",
        "row_union",
        "--moe-row-experts",
    ]
    assert main([*argv, "8", "--moe-max-skip", "3", "--moe-max-damage", "10"]) == 0
    damage = SparseCalibration.load(out).moe["damage"]
    assert list(damage) == ["row_union:3:8"] and damage["row_union:3:8"] > 0
    capsys.readouterr()
    assert main([*argv[:-1], "--moe-max-skip", "3"]) == 2  # row_union without --moe-row-experts
    assert "needs row_experts" in capsys.readouterr().err


def test_grade_candidates_of_a_moe_model_skip_experts_first():
    """A model with routed experts gets row_union candidates at 0.7 / 0.8 / 0.9 of the experts a verify row
    reaches under a uniform router (16 experts, 4 per token, rows of 8: 14.4), sparsest first, each token keeping
    at least its top expert; a dense model gets none."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from hf_sparse_verify.cli.calibrate import _moe_candidates
    from hf_sparse_verify.sparse import SparseAttention

    attention = SparseAttention(rho=0.1, schedule="shared_window")
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64)  # fmt: skip
    with torch.device("meta"):
        moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**tiny, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16))
        dense = LlamaForCausalLM(LlamaConfig(**tiny))
    candidates = _moe_candidates(moe, 8, attention)
    assert [(c.moe.rule, c.moe.row_experts, c.moe.max_skip) for c in candidates.values()] == [
        ("row_union", 10, 3), ("row_union", 12, 3), ("row_union", 13, 3)
    ]  # fmt: skip
    assert all(c.attention == attention for c in candidates.values())
    assert list(candidates)[0].startswith("experts 10 of 16 per row")
    assert _moe_candidates(dense, 8, attention) == {}


def test_calibrate_grade_on_the_moe_fixture_grades_expert_skipping(tmp_path, shared_models):
    """``--grade`` on code-moe grades its expert-skipping candidates first, in rows of --verify-tokens, and a
    near_exact grant of one of them runs it. In a child process without the Triton interpreter (the reference ops:
    interpreted, the experts kernels take minutes here)."""
    from hf_sparse_verify.sparse.calibration import SparseCalibration

    prompts = tmp_path / "prompts.jsonl"
    texts = [json.loads(line)["text"] for line in (shared_models / "prompts.jsonl").read_text().splitlines()[:2]]
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "cal"
    argv = ["calibrate", "--model", str(shared_models / "code-moe"), "--prompt-file", str(prompts), "--out", str(out),
            "--max-tokens", "160", "--device", "cpu", "--no-ffn", "--grade", "--grade-tokens", "48"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "hf_sparse_verify.cli", *argv], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    grades = SparseCalibration.load(out).grades
    moe = [g for g in grades if g["setting"]["moe"] is not None]
    assert [g["setting"]["moe"]["row_experts"] for g in moe] == [10, 12, 13] and grades[:3] == moe
    assert all(g["measures"]["positions"] == 2 * 47 for g in grades)
    assert "grade experts 10 of 16 per row" in done.stdout
    granted = SparseCalibration.load(out).granted("near_exact")
    first = next((g for g in grades if g["class"] == "near_exact"), None)
    assert (granted is None) == (first is None)
    if first is not None:
        assert granted.to_dict()["moe"] == first["setting"]["moe"]


def test_unreachable_hub_id_is_one_line_without_retries(monkeypatch, capsys, no_model_loads):
    """A Hub id that is neither cached nor reachable fails before anything loads (no download retries)."""
    import hf_sparse_verify.cli._common as common

    monkeypatch.setattr(common, "_cached_on_hub", lambda repo_id: False)
    monkeypatch.setattr(common, "_hub_unreachable", lambda: "no connection to huggingface.co: test")
    status, _, err = _run(["generate", "--model", "someorg/some-model"], capsys)
    _assert_one_line_error(status, err, "is not in the Hugging Face cache, and the Hub cannot be reached")
