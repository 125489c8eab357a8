"""The survey's tiny models from transformers' own model-tester configs (``arch_survey.tester_config``).

The first tests build a small stand-in for transformers' ``tests`` folder (a tester module with relative imports, a
decoy tester of another model type, a module that fails to import), so they need nothing downloaded. The last runs
against a real copy of transformers' ``tests`` folder, named by ``HSV_TESTER_CONFIGS`` or unpacked at
``.carry/transformers-tests/tests``; it skips where there is none.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import arch_survey
import pytest
import torch
from arch_survey import VOCAB, prompts, survey

ROOT = Path(__file__).resolve().parents[1]

_COMMON = """
def small(config_class, **sizes):
    return config_class(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, **sizes)
"""

_LLAMA = """
from transformers import LlamaConfig, MistralConfig

from ...test_modeling_common import small


class LlamaVisionModelTester:  # a decoy: another model type, listed first
    def __init__(self, parent):
        self.parent = parent

    def get_config(self):
        return small(MistralConfig, vocab_size=50)


class LlamaModelTester:
    def __init__(self, parent, vocab_size=40):
        parent.assertEqual(vocab_size, 40)  # testers check things through their parent test case
        self.vocab_size = vocab_size

    def prepare_config_and_inputs(self):
        return None, small(LlamaConfig, vocab_size=self.vocab_size)
"""


@pytest.fixture
def fake_tests(tmp_path) -> Path:
    tests = tmp_path / "transformers" / "tests"
    files = {
        "__init__.py": "",
        "test_modeling_common.py": _COMMON,
        "models/__init__.py": "",
        "models/llama/__init__.py": "",
        "models/llama/test_modeling_llama.py": _LLAMA,
        "models/qwen3/test_modeling_qwen3.py": "import a_module_nobody_has\n",
    }
    for name, text in files.items():
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text(textwrap.dedent(text))
    return tests


def test_tester_config_picks_the_tester_of_the_model_type(fake_tests):
    config = arch_survey.tester_config("llama", fake_tests)
    assert config.model_type == "llama" and config.vocab_size == 40 and config.hidden_size == 32


def test_tests_folder_accepts_the_source_tree(fake_tests):
    assert arch_survey.tests_folder(fake_tests.parent) == fake_tests.resolve()
    assert arch_survey.tester_config("llama", fake_tests.parent).vocab_size == 40


def test_no_tester_config_where_the_module_is_missing_or_does_not_import(fake_tests):
    assert (
        arch_survey.tester_config("qwen3", fake_tests) is None
    )  # ModuleNotFoundError inside the test module
    assert arch_survey.tester_config("mistral", fake_tests) is None  # no tests/models/mistral


def test_prompts_stay_within_a_small_vocabulary():
    ids, mask = prompts(40)
    assert int(ids[mask.bool()].min()) >= 3 and int(ids.max()) < 40
    assert torch.equal(prompts()[0], prompts(VOCAB)[0])


def test_survey_records_the_config_it_used(fake_tests):
    tester = survey("llama", fake_tests)
    assert (tester.config, tester.status, tester.config_note) == ("tester", "identical", "")
    fallback = survey("qwen3", fake_tests)
    assert fallback.config == "default" and fallback.status == "identical"
    assert "a_module_nobody_has" in fallback.config_note
    assert survey("llama").config == "default"


def _real_tests() -> Path | None:
    candidates = [os.environ.get("HSV_TESTER_CONFIGS"), ROOT / ".carry" / "transformers-tests" / "tests"]
    for path in candidates:
        if path and (arch_survey.tests_folder(Path(path)) / "models" / "llama").is_dir():
            return arch_survey.tests_folder(Path(path))
    return None


@pytest.mark.skipif(
    _real_tests() is None,
    reason="no copy of transformers' tests folder: set HSV_TESTER_CONFIGS or unpack it at .carry/transformers-tests/",
)
def test_llama_from_the_real_tester_config():
    outcome = survey("llama", _real_tests())
    assert outcome.config == "tester", outcome.config_note
    assert outcome.status == "identical", outcome.reason
