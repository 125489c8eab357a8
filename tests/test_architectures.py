"""Every causal LM in transformers' registry (tiny random float32 model, left-padded batch of 2, prompt_lookup and
vegas): token-identical to plain greedy ``generate``, or refused with a specific reason before generating.

No architecture may give different tokens or an unexplained exception. Architectures whose tiny model cannot be
built offline (or whose plain ``generate`` fails) are skipped with the reason; ``scripts/supported_models.py`` runs
the same survey and writes the README's table. The whole file takes about a minute on one CPU thread.
"""

from __future__ import annotations

import re

import pytest
import torch
from arch_survey import MAX_NEW, PAD, STRATEGIES, build_model, causal_lm_types, prompts, survey
from conftest import noisy_copy

import hf_sparse_verify as hsv

#: a refusal names the (text) model type, the class, and what is missing
REFUSAL = re.compile(r"^model type '[\w-]+' \(\w+\) is not supported: .{20,}")


@pytest.mark.parametrize("model_type", causal_lm_types())
def test_identical_or_refused(model_type):
    outcome = survey(model_type)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status in ("identical", "refused"), f"{model_type}: {outcome.status}: {outcome.reason}"
    if outcome.status == "refused":
        assert REFUSAL.match(outcome.reason), outcome.reason


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("model_type", ["gemma2", "cohere2", "gpt_oss", "deepseek_v3", "minicpm3"])
def test_triton_backend_routes_modified_logits_to_reference(model_type, strategy):
    """Soft-capping, sinks and MLA head sizes take the reference path inside the triton backend (CPU: the Triton
    interpreter runs the cache-write kernel; the attention never reaches a kernel)."""
    model = build_model(model_type)
    ids, mask = prompts()
    common = dict(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD
    )
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common,
            custom_generate=hsv.generate,
            speculation=dict(attention_backend="triton", cuda_graphs=False, **STRATEGIES[strategy]),
            **({"draft_model": noisy_copy(model)} if strategy == "draft_model" else {}),
        )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("model_type", ["gemma2", "gpt_oss"])
def test_prefill_in_row_chunks(model_type, monkeypatch):
    """Soft-capped or sink layers prefill in blocks of query rows; blocks smaller than the prompt change nothing."""
    from hf_sparse_verify.attention import eager as reference

    monkeypatch.setattr(reference, "ROW_CHUNK", 5)
    assert survey(model_type).status == "identical"
