"""Every script in examples/, and the README's opening example, runs on the embedded demo pair (CPU, no downloads)
with few new tokens.

The scripts run in this process through `runpy` (a subprocess would spend seconds importing torch again), as
``python examples/<name>.py <args>`` would run them.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
README = Path(__file__).resolve().parents[1] / "README.md"

#: script -> (arguments, text its output must contain); "{tmp}" is replaced by a temporary folder
CASES = {
    "01_prompt_lookup.py": (
        ["--max-new-tokens", "24"],
        ["strategy=prompt_lookup", "identical to plain generate"],
    ),
    "02_draft_model.py": (
        ["--max-new-tokens", "16"],
        ["strategy=draft_model", "identical to plain generate"],
    ),
    "03_vegas_long_prompt.py": (
        ["--prompt-tokens", "512", "--max-new-tokens", "16"],
        [
            "prompt: 512 tokens; draft steps attend to about 64",
            "strategy=vegas",
            "identical to plain generate",
        ],
    ),
    "04_utility_k_policy.py": (
        ["--max-new-tokens", "48", "--out", "{tmp}"],
        ["k_policy=utility", "'baseline'", "'test'", "utility_trace.png"],
    ),
    "05_pipeline.py": (["--max-new-tokens", "12"], ["identical to the plain pipeline"]),
    "06_publish_custom_generate.py": (
        ["--max-new-tokens", "12", "--out", "{tmp}"],
        ["stored config: strategy=prompt_lookup num_draft_tokens=6", "identical to plain generate"],
    ),
}


@pytest.fixture(autouse=True)
def one_thread():
    """The demo models are tiny: one thread is fastest and avoids oversubscribing a shared CI machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_every_example_has_a_case():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path, monkeypatch, capsys):
    args, expected = CASES[name]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / name), *args])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    out = capsys.readouterr().out
    for text in expected:
        assert text in out, f"{name}: {text!r} not in its output:\n{out[-2000:]}"


def test_utility_example_writes_its_plot_where_told(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        sys, "argv", ["04_utility_k_policy.py", "--max-new-tokens", "24", "--out", str(tmp_path)]
    )
    runpy.run_path(str(EXAMPLES / "04_utility_k_policy.py"), run_name="__main__")
    png = tmp_path / "utility_trace.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in capsys.readouterr().out


def test_readme_opening_example_runs(capsys):
    readme = README.read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert readme.index(code) < readme.index("## Use")  # the example of the opening, not a later one
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("def fibonacci(n):") and "strategy=prompt_lookup" in out
