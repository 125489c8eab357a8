"""The fused experts on a CUDA GPU (skipped elsewhere): the compiled kernels against the float64 reference at the
Qwen3-30B-A3B expert shape, CUDA-graph capture and replay with new routing, run-to-run determinism, and float32
greedy ``hf_sparse_verify.generate`` through the fused path equal to plain ``generate`` on Qwen3-MoE, Mixtral,
OLMoE, Qwen2-MoE (random weights) and the trained ``code-moe`` fixture."""

from __future__ import annotations

import pytest
import torch
from conftest import ragged_batch
from moe_models import MOE_ARCHS, make_moe

import hf_sparse_verify as hsv
from hf_sparse_verify.integrations import FUSED_EXPERTS, decoding_implementation
from hf_sparse_verify.kernels.fused_experts import bench as fe_bench
from hf_sparse_verify.kernels.fused_experts import fused_experts, fused_experts_naive
from hf_sparse_verify.kernels.fused_experts import kernel as kernel_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def test_fused_is_the_cuda_default():
    assert decoding_implementation(CUDA) == FUSED_EXPERTS
    assert decoding_implementation(CUDA, use_fused=True) == FUSED_EXPERTS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens, skip", [(1, False), (8, True), (16, False), (160, True)])
def test_compiled_kernels_match_reference(dtype, tokens, skip):
    module = fe_bench.experts_module(CUDA, dtype)
    x = torch.randn(tokens, fe_bench.HIDDEN, device=CUDA, dtype=dtype)
    index, weights = fe_bench.route(tokens, fe_bench.EXPERTS, fe_bench.TOP_K, CUDA, dtype, seed=tokens)
    n_active = torch.randint(0, fe_bench.TOP_K + 1, (tokens,), device=CUDA) if skip else None
    out = torch.full_like(x, float("nan"))
    kernel_module.launch(x, module.gate_up_proj, module.down_proj, index, weights, n_active, False, out=out)
    ref = fused_experts_naive(
        x.double(), module.gate_up_proj.double(), module.down_proj.double(), index, weights.double(), n_active
    )
    scale = ref.abs().max()
    tol = 1e-5 if dtype == torch.float32 else 1.5e-2
    torch.testing.assert_close(out.double() / scale, ref / scale, rtol=0, atol=tol)
    # the residual epilogue (FusedDecoderLayer): bitwise the decoder layer's `residual + experts` on the GPU
    residual = torch.randn_like(x)
    summed = kernel_module.launch(
        x, module.gate_up_proj, module.down_proj, index, weights, n_active, False, residual=residual
    )
    assert torch.equal(summed, residual + out)


def test_graph_capture_replays_new_routing_deterministically():
    module = fe_bench.experts_module(CUDA, torch.bfloat16)
    x = torch.randn(8, fe_bench.HIDDEN, device=CUDA, dtype=torch.bfloat16)
    index, weights = fe_bench.route(8, fe_bench.EXPERTS, fe_bench.TOP_K, CUDA, torch.bfloat16, seed=1)
    n_active = torch.full((8,), fe_bench.TOP_K, device=CUDA)
    args = (x, module.gate_up_proj, module.down_proj, index, weights, n_active)
    fused_experts(*args)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(*args)
    for seed in (2, 3):
        new_index, new_weights = fe_bench.route(
            8, fe_bench.EXPERTS, fe_bench.TOP_K, CUDA, torch.bfloat16, seed=seed
        )
        x.normal_()
        index.copy_(new_index)
        weights.copy_(new_weights)
        n_active.random_(1, fe_bench.TOP_K + 1)
        graph.replay()
        eager = fused_experts(*args)
        assert torch.equal(out, eager)  # same kernels, no atomics: bitwise equal
        assert torch.equal(eager, fused_experts(*args))


def _generate(model, ids, mask, **speculation):
    return model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=40,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy="prompt_lookup", num_draft_tokens=4, **speculation),
        return_dict_in_generate=True,
    )


@pytest.mark.parametrize("arch", MOE_ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_plain_generate(launches, arch, batch):
    """float32, random weights: the captured verify / decode steps on the fused experts give plain greedy output."""
    model = make_moe(arch).cuda()
    ids, mask = (t.cuda() for t in ragged_batch(batch))
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    out = _generate(model, ids, mask)
    assert torch.equal(out.sequences, expected)
    assert launches and out.speculation.graph_capture_s > 0
    print(arch, "experts implementation outside the call:", model.get_experts_implementation())


@pytest.mark.fixtures
@pytest.mark.parametrize("batch", [1, 3])
def test_code_moe_greedy_equals_plain_generate(shared_models, launches, batch):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = (
        AutoModelForCausalLM.from_pretrained(shared_models / "code-moe", dtype=torch.float32).cuda().eval()
    )
    tok = AutoTokenizer.from_pretrained(shared_models / "code-moe")
    tok.padding_side = "left"
    prompts = [json.loads(line) for line in open(shared_models / "prompts.jsonl")]
    texts = [p["text"] for p in prompts if p["len"] == 512][:batch]
    texts = [t[: 600 + 300 * i] for i, t in enumerate(texts)]
    inputs = tok(texts, return_tensors="pt", padding=True).to(CUDA)
    expected = model.generate(**inputs, max_new_tokens=64, do_sample=False)
    out = model.generate(
        **inputs,
        max_new_tokens=64,
        do_sample=False,
        custom_generate=hsv.generate,
        speculation=dict(strategy="prompt_lookup", num_draft_tokens=4),
        return_dict_in_generate=True,
    )
    assert torch.equal(out.sequences, expected)
    assert launches
