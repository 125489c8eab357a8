"""`FusedRouter` vs transformers' five top-k router classes: bitwise on the eager path (CPU), within the kernel's
rounding on the op path (Triton interpreted), the fallbacks, `replaceable_router`'s refusals and the switch's router rule."""

from __future__ import annotations

import doctest

import pytest
import torch
from conftest import make_model
from transformers import models as hf_models

import hf_sparse_verify.integrations.router as router_module
from hf_sparse_verify.integrations import Mode, plan_swaps
from hf_sparse_verify.integrations.router import MAX_ROWS, FusedRouter, replaceable_router
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.moe_router import route_from_logits

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)

#: name -> (config class, router class, config fields giving E experts, k per token)
ROUTERS = {
    "qwen3_moe": (hf_models.qwen3_moe.Qwen3MoeConfig, "Qwen3MoeTopKRouter", "num_experts"),
    "qwen3_next": (hf_models.qwen3_next.Qwen3NextConfig, "Qwen3NextTopKRouter", "num_experts"),
    "qwen2_moe": (hf_models.qwen2_moe.Qwen2MoeConfig, "Qwen2MoeTopKRouter", "num_experts"),
    "olmoe": (hf_models.olmoe.OlmoeConfig, "OlmoeTopKRouter", "num_experts"),
    "mixtral": (hf_models.mixtral.MixtralConfig, "MixtralTopKRouter", "num_local_experts"),
}
CASES = [(arch, norm) for arch in ROUTERS for norm in ((None,) if arch == "mixtral" else (True, False))]


def make_router(arch: str, norm: bool | None, experts=60, top_k=8, hidden=48, dtype=torch.float32, seed=0):
    config_cls, router_name, experts_field = ROUTERS[arch]
    fields = {"hidden_size": hidden, experts_field: experts, "num_experts_per_tok": top_k}
    if norm is not None:
        fields["norm_topk_prob"] = norm
    module = getattr(hf_models, arch)
    router_cls = getattr(getattr(module, f"modeling_{arch}"), router_name)
    torch.manual_seed(seed)
    router = router_cls(config_cls(**fields))
    with torch.no_grad():
        router.weight.normal_(0, 2 / hidden**0.5)
    return router.to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch, norm", CASES)
def test_eager_path_is_bitwise_transformers(arch, norm, dtype):
    router = make_router(arch, norm, dtype=dtype)
    replacement = FusedRouter(router)
    assert replacement.weight is router.weight
    for shape in ((1, 48), (2, 5, 48), (3 * MAX_ROWS, 48)):
        x = torch.randn(*shape).to(dtype)
        with torch.no_grad():
            got, expected = replacement(x), router(x)
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("arch, norm", CASES)
def test_op_path_matches_transformers(monkeypatch, arch, norm, dtype):
    """With the kernel let onto CPU (interpreted): logits within one rounding step, the routing of those logits
    exact (float32: the same experts as transformers), scores within the cast's rounding; more than MAX_ROWS rows
    and autograd fall back to transformers' arithmetic."""
    monkeypatch.setattr(router_module, "fused_router_runs", lambda device: True)
    monkeypatch.setattr(router_module, "moe_router", counted := _Counted(router_module.moe_router))
    router = make_router(arch, norm, dtype=dtype, seed=1)
    replacement = FusedRouter(router)
    x = torch.randn(2, 3, 48).to(dtype)
    with torch.no_grad():
        (logits, scores, indices), (ref_logits, ref_scores, ref_indices) = replacement(x), router(x)
    assert counted.calls == 1
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(logits.float(), ref_logits.float(), rtol=tol, atol=tol)
    assert scores.dtype == ref_scores.dtype and indices.dtype == ref_indices.dtype
    normalize = replacement.normalize
    own_scores, own_indices = route_from_logits(logits, router.top_k, normalize, replacement.scores_float32)
    assert torch.equal(indices, own_indices)
    torch.testing.assert_close(scores.float(), own_scores.float(), rtol=tol, atol=tol)
    if dtype == torch.float32:
        assert torch.equal(indices, ref_indices)
        torch.testing.assert_close(scores, ref_scores, rtol=1e-6, atol=1e-6)

    big = torch.randn(MAX_ROWS + 1, 48).to(dtype)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(replacement(big), router(big)))
    replacement(x)  # grad enabled and the weight requires grad: the op has no backward
    assert counted.calls == 1  # neither fallback called the op


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def test_refuses_other_modules():
    router = make_router("qwen3_moe", True)
    assert replaceable_router(router)
    config = hf_models.mixtral.MixtralConfig(hidden_size=32, num_local_experts=4, num_experts_per_tok=2)
    block = hf_models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(config)
    assert replaceable_router(block.gate)
    assert not replaceable_router(block)  # the block carries Mixtral's jitter noise
    assert not replaceable_router(torch.nn.Linear(48, 60, bias=False))

    with_bias = make_router("olmoe", True)
    with_bias.bias = torch.nn.Parameter(torch.zeros(60))
    jitter = make_router("qwen2_moe", False)
    jitter.jitter_noise = 0.1
    hooked = make_router("qwen3_moe", False)
    hooked.register_forward_hook(lambda *args: None)
    bad_top_k = make_router("qwen3_moe", False)
    bad_top_k.top_k = 61
    for module in (with_bias, jitter, hooked, bad_top_k):
        assert not replaceable_router(module)
        with pytest.raises(ValueError, match="not a plain top-k router"):
            FusedRouter(module)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe"])
def test_router_replacements_bitwise_and_restored(arch):
    """Every router replaced by a `FusedRouter` (by hand: on CPU the switch keeps routers, its kernel does not run
    here) computes bitwise what the original does; restoring gives the model back."""
    model = make_model(arch)
    keys = list(model.state_dict())
    ids = torch.randint(3, 90, (2, 7))
    with torch.no_grad():
        expected = model(ids).logits
    routers = [
        (parent, name, child)
        for parent in list(model.modules())
        for name, child in parent.named_children()
        if replaceable_router(child)
    ]
    assert len(routers) == model.config.num_hidden_layers
    assert not any(
        isinstance(new, FusedRouter) for *_, new in plan_swaps(model, Mode(attention=False, fused=True))
    )
    for parent, name, child in routers:
        setattr(parent, name, FusedRouter(child))
    try:
        with torch.no_grad():
            assert sum(isinstance(m, FusedRouter) for m in model.modules()) == len(routers)
            assert list(model.state_dict()) == keys
            assert torch.equal(model(ids).logits, expected)
    finally:
        for parent, name, child in routers:
            setattr(parent, name, child)
    assert not any(isinstance(m, FusedRouter) for m in model.modules())


def test_docstring_examples():
    assert doctest.testmod(router_module, extraglobs={"torch": torch}).failed == 0
