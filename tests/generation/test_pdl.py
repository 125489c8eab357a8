"""Programmatic dependent launch (PDL) of our Triton kernels. Everywhere: every kernel that takes part waits for the
kernel before it as its first statement (checked on the source: a kernel launched with PDL that touched memory
before `pdl_wait` would race with the previous kernel), every launch site passes `pdl_launch`, and PDL is off
wherever it cannot apply. On a Hopper (or newer) GPU: whole greedy ``generate`` calls (CUDA graphs, Triton fast
path, dense and MoE, lossless and sparse strategies) give the same tokens with PDL on and off, and with it on the
same tokens as plain ``generate`` in float32."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import make_model, ragged_batch

import hf_sparse_verify as hsv
from hf_sparse_verify.kernels._triton import pdl_launch, pdl_on, set_pdl

KERNELS = Path(hsv.__file__).parent / "kernels"


def _is_jit(fn: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "triton.jit" for d in fn.decorator_list)


def _kernels_and_launches():
    """(path, {jit function name: node}, [(launched name, call node)]) per kernel module."""
    for path in sorted(KERNELS.glob("*/kernel.py")):
        tree = ast.parse(path.read_text())
        jit = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and _is_jit(n)}
        launches = [
            (node.func.value.id, node)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in jit
        ]
        yield path, jit, launches


def test_every_launched_kernel_waits_for_the_previous_one_first():
    launched = 0
    for path, jit, launches in _kernels_and_launches():
        for name, call in launches:
            launched += 1
            fn = jit[name]
            assert "PDL" in [a.arg for a in fn.args.args], f"{path.parent.name}.{name} takes no PDL constexpr"
            body = fn.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):  # docstring
                body = body[1:]
            first = ast.unparse(body[0])
            assert first == "pdl_wait(PDL)", (
                f"{path.parent.name}.{name} starts with {first!r}, not pdl_wait(PDL)"
            )
            spread = [ast.unparse(k.value) for k in call.keywords if k.arg is None]
            assert any(s.startswith("pdl_launch(") for s in spread), (
                f"a launch of {path.parent.name}.{name} does not pass **pdl_launch(device)"
            )
    assert launched >= 25  # every kernel folder's launches were found


def test_pdl_is_off_where_it_cannot_apply():
    assert pdl_launch(torch.device("cpu")) == {"PDL": False}
    assert not pdl_on(torch.device("cpu"))
    previous = set_pdl(False)
    try:
        if torch.cuda.is_available():
            assert pdl_launch(torch.device("cuda")) == {"PDL": False}
        assert set_pdl(True) is False
    finally:
        set_pdl(previous)


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9

SETTINGS = {
    "plain": dict(strategy="prompt_lookup", k_policy="plain"),
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
    "sparse_verify": dict(
        strategy="prompt_lookup",
        num_draft_tokens=4,
        lossy_sparse_verify=dict(attention=dict(block_size=16, dense_below=64, rho=0.3)),
    ),
}


def _generate(model, ids, mask, setting: str) -> torch.Tensor:
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=24,
        custom_generate=hsv.generate,
        speculation=dict(max_draft_tokens=8, **SETTINGS[setting]),
    )


@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.0 or newer (PDL)")
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_generate_same_tokens_with_and_without_pdl(arch, dtype, setting):
    model = make_model(arch).to(device="cuda", dtype=dtype)
    ids, mask = (t.cuda() for t in ragged_batch(3, 140))
    outputs = {}
    previous = set_pdl(True)
    try:
        for flag in (True, False):
            set_pdl(flag)
            hsv.clear_graph_cache()  # graphs keep the launches they were captured with
            outputs[flag] = _generate(model, ids, mask, setting)
    finally:
        set_pdl(previous)
        hsv.clear_graph_cache()
    assert torch.equal(outputs[True], outputs[False])
    if dtype == torch.float32 and setting != "sparse_verify":
        expected = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=24)
        assert torch.equal(outputs[True], expected)
