"""A low-bit copy of the target as its draft: lossless (the target verifies), the original untouched, and the
rounding visible in acceptance."""

from __future__ import annotations

import doctest

import pytest
import torch
from conftest import make_model, ragged_batch

import hf_sparse_verify as hsv
import hf_sparse_verify.generation.drafters.low_bit as low_bit
from hf_sparse_verify.generation.drafters.low_bit import low_bit_bytes, low_bit_copy, low_bit_linears


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_greedy_with_a_low_bit_draft_equals_plain_generate(weights):
    model = make_model("llama")
    before = {n: p.clone() for n, p in model.named_parameters()}
    draft = low_bit_copy(model, weights, group_size=16)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the target is untouched
    changed = [n for n, m in low_bit_linears(draft) if not torch.equal(m.weight, model.get_submodule(n).weight)]
    assert changed and len(changed) == len(low_bit_linears(model))
    ids, mask = ragged_batch(3)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=23, do_sample=False)
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=23, do_sample=False, custom_generate=hsv.generate,
        speculation=dict(strategy="draft_model", num_draft_tokens=4), draft_model=draft,
        return_dict_in_generate=True,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    accepted = [a for row in out.speculation.accepted_tokens for a in row if a is not None]
    assert sum(accepted) > 0  # the rounded copy still drafts what the target says, often


def test_int4_draft_rounds_more_than_int8():
    model = make_model("llama")
    errors = {}
    for weights in ("int8", "int4"):
        draft = low_bit_copy(model, weights, group_size=16)
        errors[weights] = sum(
            float((m.weight - model.get_submodule(n).weight).detach().abs().mean()) for n, m in low_bit_linears(draft)
        )
    assert 0 < errors["int8"] < errors["int4"]


def test_bytes_and_bad_input():
    model = make_model("llama")
    sizes = low_bit_bytes(model, "int4", group_size=16)
    assert sizes["low_bit"] < sizes["original"] / 4  # float32 weights: int4 is an eighth plus scales
    with pytest.raises(ValueError, match="one of"):
        low_bit_copy(model, "fp4")


def test_docstring_examples():
    assert doctest.testmod(low_bit).failed == 0
