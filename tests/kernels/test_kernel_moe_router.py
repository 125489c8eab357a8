"""MoE router: both Triton paths (logits in the kernel, logits from F.linear; interpreted on CPU) vs the reference
on odd shapes and both dtypes, the tie order, poisoned outputs, the fused path's counter (back to 0, repeatable
results), CUDA-graph replays (CUDA only), the custom op, input checks and the benchmark entry."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F

import hf_sparse_verify.kernels.moe_router.op as op_module
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.moe_router import kernel as kernel_module
from hf_sparse_verify.kernels.moe_router import moe_router, moe_router_naive, route_from_logits

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)
#: where the Triton paths run: interpreted on CPU, compiled on CUDA
DEVICES = [
    d
    for d in ("cpu", "cuda")
    if triton_runs_on(torch.device(d)) and (d == "cpu" or torch.cuda.is_available())
]
#: logits relative to their scale: float32 summation order; bf16 one rounding step (the CPU interpreter truncates
#: where F.linear rounds to nearest)
LOGIT_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
#: scores of the same logits: float32 exp / division order; bf16 one rounding step of the cast
SCORE_TOL = {torch.float32: 4e-6, torch.bfloat16: 8e-3}


@pytest.fixture
def poisoned(monkeypatch):
    """Every output starts as NaN (floats) or a huge id (ints), so an unwritten element fails loudly."""

    def empty(shape, device, dtype):
        fill = float("nan") if dtype.is_floating_point else 2**40
        return torch.full(shape, fill, device=device, dtype=dtype)

    monkeypatch.setattr(kernel_module, "_empty", empty)


def make_inputs(tokens, experts, hidden, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(device, dtype)
    w = (torch.randn(experts, hidden, generator=g) * 2 / hidden**0.5).to(device, dtype)
    return x, w


#: (tokens, experts, top_k, hidden): T = 1 (multiply-reduce), 5 and 16 (tl.dot) in the fused path, odd hidden
#: sizes (one hidden split at 63, several at 200), more than FUSED_MAX_ROWS rows (F.linear either way)
SHAPES = [
    (1, 8, 1, 63),
    (5, 60, 2, 200),
    (16, 128, 8, 63),
    (1, 128, 8, 200),
    (16, 8, 8, 200),
    (5, 128, 1, 63),
    (16, 60, 2, 200),
    (1, 60, 8, 63),
    (17, 60, 2, 63),
]
ROUTINGS = [(True, False), (False, False), (True, True), (False, True)]  # (normalize, scores_float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("logits_in_kernel", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize, scores_float32", ROUTINGS)
@pytest.mark.parametrize("tokens, experts, top_k, hidden", SHAPES)
def test_matches_reference(
    poisoned, device, logits_in_kernel, dtype, normalize, scores_float32, tokens, experts, top_k, hidden
):
    """Logits match F.linear's; the routing of the kernel's own logits is the reference routing of those logits
    (the same experts in the same order, so 16-bit logits one rounding step apart cannot flip a near tie)."""
    x, w = make_inputs(tokens, experts, hidden, dtype, seed=tokens * experts + top_k, device=device)
    logits, scores, indices = kernel_module.launch(
        x, w, top_k, normalize, scores_float32, logits_in_kernel=logits_in_kernel
    )
    ref_logits = F.linear(x, w)
    assert logits.dtype == dtype and logits.shape == (tokens, experts)
    scale = ref_logits.float().abs().max().clamp_min(1.0)
    torch.testing.assert_close(
        logits.float() / scale, ref_logits.float() / scale, rtol=0, atol=LOGIT_TOL[dtype]
    )

    ref_scores, ref_indices = route_from_logits(logits, top_k, normalize, scores_float32)
    assert indices.dtype == torch.int64 and torch.equal(indices, ref_indices)
    assert scores.dtype == (torch.float32 if scores_float32 else dtype) and scores.shape == (tokens, top_k)
    tol = (1e-6 if device == "cpu" else 4e-6) if scores_float32 else SCORE_TOL[dtype]  # CUDA: approximate exp
    torch.testing.assert_close(scores.float(), ref_scores.float(), rtol=tol, atol=tol)
    if dtype == torch.float32:  # no near ties at these seeds: the whole reference agrees
        assert torch.equal(indices, moe_router_naive(x, w, top_k, normalize, scores_float32)[2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("logits_in_kernel", [True, False])
def test_equal_probabilities_lower_expert_first(poisoned, monkeypatch, device, logits_in_kernel):
    """Experts with identical weight rows tie exactly; the lower id comes first (the reference's stable order)."""
    monkeypatch.setattr(kernel_module, "LOGITS_IN_KERNEL", logits_in_kernel)
    x, w = make_inputs(3, 16, 32, torch.float32, seed=1, device=device)
    w[9], w[13], w[2] = w[4], w[4], w[4] * 3  # 4, 9, 13 tie; 2 differs
    logits, scores, indices = moe_router(x, w, 6, normalize=True)
    ref = moe_router_naive(x, w, 6, True, False)
    assert torch.equal(indices, ref[2])
    for row in indices.tolist():
        tied = [e for e in row if e in (4, 9, 13)]
        assert tied == sorted(tied)
    torch.testing.assert_close(scores, ref[1], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tokens, h_slice", [(1, None), (5, None), (16, 64), (16, 1024)])
def test_counter_returns_to_zero(poisoned, device, tokens, h_slice):
    """The last program resets the arrival counter: a second call starts from 0 and gives bitwise the same
    result (a counter left at n would make no program, or the wrong one, route)."""
    x, w = make_inputs(tokens, 60, 200, torch.bfloat16, seed=5, device=device)
    first = kernel_module.launch(x, w, 4, True, False, logits_in_kernel=True, h_slice=h_slice)
    assert kernel_module._counter(x.device).tolist() == [0]
    second = kernel_module.launch(x, w, 4, True, False, logits_in_kernel=True, h_slice=h_slice)
    assert kernel_module._counter(x.device).tolist() == [0]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    ref_scores, ref_indices = route_from_logits(first[0], 4, True, False)
    assert torch.equal(first[2], ref_indices)
    tol = SCORE_TOL[torch.bfloat16]
    torch.testing.assert_close(first[1].float(), ref_scores.float(), rtol=tol, atol=tol)


def test_fused_split_aims_at_target_programs():
    assert kernel_module.fused_split(128, 2048) == (256, 8)  # Qwen3-30B-A3B: 8 expert tiles x 8 splits
    assert kernel_module.fused_split(8, 4096) == (64, 64)  # Mixtral: one tile
    assert kernel_module.fused_split(60, 63) == (64, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_graph_replays(tokens, dtype):
    """Three router calls (three layers) captured in one graph and replayed with new inputs: every replay routes
    the new rows as the reference routes the op's logits, and the logits match F.linear's."""
    device = torch.device("cuda")
    layers = [make_inputs(tokens, 128, 2048, dtype, seed=s, device=device)[1] for s in range(3)]
    x = torch.zeros(tokens, 2048, device=device, dtype=dtype)
    moe_router(x, layers[0], 8, True)  # warm-up outside capture: compiles and creates the counter
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [moe_router(x, w, 8, True) for w in layers]
    for seed in range(4):
        x.copy_(make_inputs(tokens, 128, 2048, dtype, seed=100 + seed, device=device)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert kernel_module._counter(device).tolist() == [0]
        for w, (logits, scores, indices) in zip(layers, outs):
            ref = F.linear(x, w).float()
            scale = ref.abs().max().clamp_min(1.0)
            torch.testing.assert_close(logits.float() / scale, ref / scale, rtol=0, atol=LOGIT_TOL[dtype])
            ref_scores, ref_indices = route_from_logits(logits, 8, True, False)
            assert torch.equal(indices, ref_indices)
            torch.testing.assert_close(scores.float(), ref_scores.float(), rtol=1e-6, atol=1e-6)


@needs_triton
def test_strided_input_and_empty():
    x, w = make_inputs(5, 60, 64, torch.float32, seed=2)
    strided = torch.stack([x, x], dim=-1)[..., 0]
    out = moe_router(strided, w, 4, True)
    ref = moe_router_naive(x, w, 4, True, False)
    assert torch.equal(out[2], ref[2])
    torch.testing.assert_close(out[1], ref[1], rtol=1e-6, atol=1e-6)
    logits, scores, indices = moe_router(x[:0], w, 4, True)
    assert logits.shape == (0, 60) and scores.shape == (0, 4) and indices.shape == (0, 4)


def test_float64_falls_back_to_reference_and_op_checks():
    x, w = make_inputs(3, 60, 32, torch.float64, seed=3)
    out = moe_router(x, w, 8, True, True)
    for a, b in zip(out, moe_router_naive(x, w, 8, True, True)):
        assert torch.equal(a, b)
    torch.library.opcheck(torch.ops.hsv.moe_router.default, (x, w, 8, True, False))
    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0


@needs_triton
def test_op_checks_on_the_kernel():
    x, w = make_inputs(3, 8, 32, torch.float32, seed=4)
    torch.library.opcheck(torch.ops.hsv.moe_router.default, (x, w, 2, True, False))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "weight": a["weight"][:, :16]}, "needs hidden"),
        (lambda a: {**a, "hidden": a["hidden"][None]}, "needs hidden"),
        (lambda a: {**a, "weight": a["weight"].double()}, "share one float dtype"),
        (
            lambda a: {**a, "hidden": a["hidden"].long(), "weight": a["weight"].long()},
            "share one float dtype",
        ),
        (lambda a: {**a, "weight": a["weight"].to("meta")}, "one device"),
        (lambda a: {**a, "top_k": 0}, "top_k must be"),
        (lambda a: {**a, "top_k": 9}, "top_k must be"),
        (lambda a: {**a, "weight": torch.randn(513, 32)}, "experts"),
    ],
)
def test_bad_input(change, message):
    x, w = make_inputs(3, 8, 32, torch.float32)
    args = dict(hidden=x, weight=w, top_k=2, normalize=True)
    with pytest.raises(ValueError, match=message):
        moe_router(**change(args))


@needs_triton
def test_benchmark_entry_runs():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["moe_router"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "triton+logits", "eager"}
    for first in cases[:2]:
        assert first.variant in ("triton", "triton+logits") and first.bytes_moved > 0
        expected = next(c for c in cases if c.variant == "eager" and c.params == first.params).run()
        got = first.run()
        assert torch.equal(got[2], expected[2])
        torch.testing.assert_close(got[1], expected[1], rtol=1e-6, atol=1e-6)
