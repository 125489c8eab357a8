"""MoE add + RMSNorm + router in one launch (`add_rms_norm_moe_router`, the router kernel's ``NORM`` path):
against the add + norm reference and the router of its own normed rows on odd shapes and both dtypes, every output
written (poisoned), the arrival counter back at 0, the fallback above 16 rows, CUDA-graph replays (CUDA only), the
custom op and input checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.moe_router import add_rms_norm_moe_router, route_from_logits
from hf_sparse_verify.kernels.moe_router import kernel as kernel_module
from hf_sparse_verify.kernels.rms_norm.naive import add_rms_norm_naive

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)
DEVICES = [
    d
    for d in ("cpu", "cuda")
    if triton_runs_on(torch.device(d)) and (d == "cpu" or torch.cuda.is_available())
]
#: normed rows: the variance is summed in another order than the reference's, so an element may round one step
#: the other way (float32: ~1 ulp; bf16: one bf16 step, two under the interpreter, which truncates)
NORM_TOL = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2}
LOGIT_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


@pytest.fixture
def poisoned(monkeypatch):
    """Every output of the router kernel module starts as NaN / a huge id, so an unwritten element fails."""

    def empty(shape, device, dtype):
        fill = float("nan") if dtype.is_floating_point else 2**40
        return torch.full(shape, fill, device=device, dtype=dtype)

    monkeypatch.setattr(kernel_module, "_empty", empty)


def make_inputs(tokens, experts, hidden, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    residual = torch.randn(tokens, hidden, generator=g) * 3
    norm_weight = torch.rand(hidden, generator=g) + 0.5
    w = torch.randn(experts, hidden, generator=g) * 2 / hidden**0.5
    return tuple(t.to(device, dtype) for t in (x, residual, norm_weight, w))


def check(out, x, residual, norm_weight, w, top_k, normalize, scores_float32, eps=1e-6):
    normed, total, logits, scores, indices = out
    dtype = x.dtype
    ref_normed, ref_total = add_rms_norm_naive(x, residual, norm_weight, eps)
    if dtype == torch.float32 or x.is_cuda:  # the add is eager's, rounded to the activation dtype
        assert torch.equal(total, ref_total)
    else:  # Triton's CPU interpreter truncates where the GPU rounds to nearest: one bf16 step
        torch.testing.assert_close(total.float(), ref_total.float(), rtol=1.6e-2, atol=1.6e-2)
    assert normed.dtype == dtype and not normed.isnan().any()
    torch.testing.assert_close(normed.float(), ref_normed.float(), rtol=NORM_TOL[dtype], atol=NORM_TOL[dtype])
    ref_logits = F.linear(normed, w).float()  # the kernel routes its own normed rows
    scale = ref_logits.abs().max().clamp_min(1.0)
    torch.testing.assert_close(logits.float() / scale, ref_logits / scale, rtol=0, atol=LOGIT_TOL[dtype])
    ref_scores, ref_indices = route_from_logits(logits, top_k, normalize, scores_float32)
    assert torch.equal(indices, ref_indices)
    torch.testing.assert_close(scores.float(), ref_scores.float(), rtol=8e-3, atol=8e-3)


#: (tokens, experts, top_k, hidden): T = 1 (multiply-reduce), 5 and 16 (tl.dot), 17 (two launches), odd hidden
SHAPES = [(1, 8, 2, 63), (1, 128, 8, 200), (5, 60, 2, 200), (16, 128, 8, 63), (17, 60, 4, 200)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize, scores_float32", [(True, False), (False, True)])
@pytest.mark.parametrize("tokens, experts, top_k, hidden", SHAPES)
def test_matches_add_norm_then_router(
    poisoned, device, dtype, normalize, scores_float32, tokens, experts, top_k, hidden
):
    x, residual, norm_weight, w = make_inputs(
        tokens, experts, hidden, dtype, seed=tokens + hidden, device=device
    )
    out = add_rms_norm_moe_router(x, residual, norm_weight, 1e-6, w, top_k, normalize, scores_float32)
    check(out, x, residual, norm_weight, w, top_k, normalize, scores_float32)
    if tokens <= kernel_module.FUSED_MAX_ROWS:
        assert kernel_module._counter(x.device).tolist() == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_repeatable_and_same_routing_as_two_launches(poisoned, device):
    """Two calls give bitwise the same result (the counter was reset); in float32 the routing equals the two-launch
    path's (add + norm kernel, then the router)."""
    from hf_sparse_verify.kernels.moe_router import moe_router
    from hf_sparse_verify.kernels.rms_norm import add_rms_norm

    x, residual, norm_weight, w = make_inputs(1, 128, 256, torch.float32, seed=7, device=device)
    first = add_rms_norm_moe_router(x, residual, norm_weight, 1e-5, w, 8, True)
    second = add_rms_norm_moe_router(x, residual, norm_weight, 1e-5, w, 8, True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    normed, total = add_rms_norm(x, residual, norm_weight, 1e-5)
    assert torch.equal(first[1], total)
    torch.testing.assert_close(first[0], normed, rtol=2e-6, atol=2e-6)
    assert torch.equal(first[4], moe_router(normed, w, 8, True)[2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_graph_replays(tokens, dtype):
    """Three layers' add + norm + router captured in one graph and replayed with new inputs."""
    device = torch.device("cuda")
    layers = [make_inputs(tokens, 128, 2048, dtype, seed=s, device=device) for s in range(3)]
    x = torch.zeros(tokens, 2048, device=device, dtype=dtype)
    residual = torch.zeros_like(x)
    add_rms_norm_moe_router(x, residual, layers[0][2], 1e-6, layers[0][3], 8, True)  # compile, counter
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [add_rms_norm_moe_router(x, residual, nw, 1e-6, w, 8, True) for _, _, nw, w in layers]
    for seed in range(3):
        new_x, new_residual, _, _ = make_inputs(tokens, 128, 2048, dtype, seed=100 + seed, device=device)
        x.copy_(new_x)
        residual.copy_(new_residual)
        graph.replay()
        torch.cuda.synchronize()
        assert kernel_module._counter(device).tolist() == [0]
        for (_, _, nw, w), out in zip(layers, outs):
            check(out, x, residual, nw, w, 8, True, False)


@needs_triton
def test_op_checks_on_the_kernel():
    x, residual, norm_weight, w = make_inputs(3, 8, 32, torch.float32, seed=4)
    torch.library.opcheck(
        torch.ops.hsv.add_rms_norm_moe_router.default, (x, residual, norm_weight, 1e-6, w, 2, True, False)
    )


def test_float64_is_the_reference():
    x, residual, norm_weight, w = make_inputs(3, 8, 32, torch.float64, seed=5)
    normed, total, logits, scores, indices = add_rms_norm_moe_router(
        x, residual, norm_weight, 1e-6, w, 2, True
    )
    ref_normed, ref_total = add_rms_norm_naive(x, residual, norm_weight, 1e-6)
    assert torch.equal(normed, ref_normed) and torch.equal(total, ref_total)
    assert torch.equal(logits, F.linear(ref_normed, w))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "residual": a["residual"][:2]}, "one shape"),
        (lambda a: {**a, "x": a["x"][None], "residual": a["residual"][None]}, r"\[T, H\]"),
        (lambda a: {**a, "norm_weight": a["norm_weight"].double()}, "norm_weight must be"),
        (lambda a: {**a, "norm_weight": a["norm_weight"][:16]}, "norm_weight must be"),
        (lambda a: {**a, "weight": a["weight"][:, :16]}, "needs hidden"),
        (lambda a: {**a, "top_k": 9}, "top_k must be"),
    ],
)
def test_bad_input(change, message):
    x, residual, norm_weight, w = make_inputs(3, 8, 32, torch.float32)
    args = dict(x=x, residual=residual, norm_weight=norm_weight, eps=1e-6, weight=w, top_k=2, normalize=True)
    with pytest.raises(ValueError, match=message):
        add_rms_norm_moe_router(**change(args))
