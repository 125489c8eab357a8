"""Every way in: the callable, a direct call, the custom_generate folder, pipelines and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import char_tokenizer, make_model, noisy_copy, ragged_batch
from transformers import pipeline

import hf_sparse_verify as hsv

MAX_NEW = 17


@pytest.fixture(scope="module")
def pair():
    model = make_model("llama")
    return model, noisy_copy(model)


def _plain(model, ids, mask, **kwargs):
    return model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, **kwargs
    )


def test_direct_call_equals_callable(pair):
    model, draft = pair
    ids, mask = ragged_batch(3)
    out = hsv.generate(
        model, ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, draft_model=draft
    )
    assert torch.equal(out, _plain(model, ids, mask))


def test_assistant_model_is_the_draft_model(pair):
    """transformers drops assistant_model before calling a custom callable; we take it as the draft model: with
    strategy="draft_model" it drafts, and the default strategy ("auto") gets it as one of its drafters."""
    model, draft = pair
    ids, mask = ragged_batch(3)
    for strategy in ("draft_model", "auto"):
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=MAX_NEW,
            do_sample=False,
            custom_generate=hsv.generate,
            assistant_model=draft,
            speculation={"strategy": strategy},
            return_dict_in_generate=True,
        )
        assert out.speculation.strategy == strategy
        assert torch.equal(out.sequences, _plain(model, ids, mask))
        if strategy == "draft_model":
            assert out.speculation.mean_acceptance_length > 1.5  # the noisy copy drafted


def test_draft_model_named_in_config(pair, tmp_path):
    model, draft = pair
    draft.save_pretrained(tmp_path / "draft")
    ids, mask = ragged_batch(3)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation={"strategy": "draft_model", "draft_model": str(tmp_path / "draft")},
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, _plain(model, ids, mask))
    assert out.speculation.mean_acceptance_length > 1.5  # the saved noisy copy, not some other model


def test_custom_generate_folder(pair):
    model, draft = pair
    ids, mask = ragged_batch(3)
    folder = hsv.custom_generate_path()
    assert os.path.isfile(os.path.join(folder, "custom_generate", "generate.py"))
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        custom_generate=folder,
        trust_remote_code=True,
        speculation={"strategy": "draft_model", "num_draft_tokens": 3},
        assistant_model=draft,  # the folder form takes transformers' own argument as the draft model
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, _plain(model, ids, mask))
    assert out.speculation.strategy == "draft_model"


def test_custom_generate_folder_needs_trust_remote_code(pair):
    model, _ = pair
    ids, mask = ragged_batch(1)
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=4, custom_generate=hsv.custom_generate_path()
        )


def test_config_stored_in_model_repo_needs_no_code_at_call_site(pair, tmp_path):
    """A repo with the folder and a generation_config carrying `speculation`: a bare generate() speculates."""
    import shutil

    from transformers import AutoModelForCausalLM

    model, _ = pair
    hsv.SpeculationConfig(strategy="prompt_lookup", num_draft_tokens=5).to_generation_config(
        model.generation_config
    )
    try:
        model.save_pretrained(tmp_path)
    finally:
        del model.generation_config.speculation
    shutil.copytree(os.path.join(hsv.custom_generate_path(), "custom_generate"), tmp_path / "custom_generate")
    loaded = AutoModelForCausalLM.from_pretrained(
        tmp_path, trust_remote_code=True, dtype=torch.float32
    ).eval()
    ids, mask = ragged_batch(3)
    out = loaded.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=MAX_NEW,
        do_sample=False,
        return_dict_in_generate=True,
    )
    assert out.speculation.strategy == "prompt_lookup" and max(out.speculation.draft_tokens) <= 5
    assert torch.equal(out.sequences, _plain(model, ids, mask))


@pytest.mark.parametrize("batched", [False, True])
def test_pipeline(pair, batched):
    model, draft = pair
    tok = char_tokenizer()
    # device= keeps the pipeline from moving the module's shared model to a GPU (later tests use it on the CPU)
    pipe = pipeline("text-generation", model=model, tokenizer=tok, device=model.device)
    prompts = ["abcdefg", "xyz!?", "hello world"] if batched else "abcdefg"
    kwargs = dict(max_new_tokens=MAX_NEW, do_sample=False, return_full_text=False)
    expected = pipe(prompts, **kwargs, batch_size=3)
    got = pipe(
        prompts,
        **kwargs,
        batch_size=3,
        custom_generate=hsv.generate,
        speculation={"strategy": "draft_model", "num_draft_tokens": 3},
        draft_model=draft,
    )
    assert got == expected
    assert (len(got) == 3) if batched else (len(got) == 1)


def _cli(*args: str, tmp_path) -> dict:
    out_json = tmp_path / "out.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_sparse_verify.cli",
            "generate",
            *args,
            "--json",
            str(out_json),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out_json.read_text()), proc


def test_cli_embedded_default(tmp_path):
    record, proc = _cli("--max-new-tokens", "24", "--stats", "--compare-plain", tmp_path=tmp_path)
    assert record["stats"]["strategy"] == "auto"
    assert set(record["stats"]["chosen"]) <= {"k0", "prompt_lookup", "draft_model"}
    assert "ran: " in proc.stderr
    assert record["stats"]["total_new_tokens"] > 0
    assert record["plain"]["identical"] is True
    assert "mean_acceptance_length" in proc.stderr
    assert record["outputs"][0].strip()


def test_cli_prompt_lookup_batch_from_jsonl(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"text": t}) for t in ["import os\n", "class A:\n    def f(self):\n"])
    )
    record, _ = _cli(
        "--strategy",
        "prompt_lookup",
        "--prompt-file",
        str(prompts),
        "--max-new-tokens",
        "16",
        "--compare-plain",
        tmp_path=tmp_path,
    )
    assert len(record["outputs"]) == 2 and record["plain"]["identical"] is True
