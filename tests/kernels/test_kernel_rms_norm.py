"""RMSNorm kernel vs its reference, the reference vs transformers' modules, and the module replacement."""

from __future__ import annotations

import pytest
import torch
from conftest import ARCHITECTURES, make_model

from hf_sparse_verify.integrations import Mode, TritonRMSNorm, TritonRMSNormGated, speculation_mode
from hf_sparse_verify.integrations.rms_norm import FLOAT32_SCALED, GATED, REPLACEABLE, ZERO_CENTERED
from hf_sparse_verify.kernels.rms_norm import (
    add_rms_norm,
    add_rms_norm_naive,
    rms_norm,
    rms_norm_float32_naive,
    rms_norm_gated,
    rms_norm_gated_naive,
    rms_norm_naive,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 5, 100), (7, 48)])
def test_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).to(dtype) * 3
    w = torch.rand(shape[-1], generator=g).to(dtype) + 0.5
    out = rms_norm(x, w, 1e-6)
    ref = rms_norm_naive(x, w, 1e-6)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    # float32: summation order only; 16-bit: at most one rounding step (Triton's CPU interpreter also truncates
    # where the GPU rounds to nearest)
    tol = 1e-6 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 5, 100), (7, 48)])
def test_add_matches_reference(dtype, shape):
    """The fused residual add + norm: the sum as eager adds it (float32: bitwise; 16-bit: the CPU interpreter
    truncates where the GPU rounds, one step), the norm of that sum."""
    g = torch.Generator().manual_seed(sum(shape) + 1)
    x, r = (torch.randn(*shape, generator=g).to(dtype) * 3 for _ in range(2))
    w = torch.rand(shape[-1], generator=g).to(dtype) + 0.5
    normed, total = add_rms_norm(x, r, w, 1e-6)
    ref_normed, ref_total = add_rms_norm_naive(x, r, w, 1e-6)
    assert (
        total.dtype == dtype and normed.dtype == ref_normed.dtype and normed.shape == total.shape == x.shape
    )
    if dtype == torch.float32:
        assert torch.equal(total, r + x)
    tol = 1e-6 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(total.float(), ref_total.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(normed.float(), ref_normed.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(normed.float(), rms_norm_naive(r + x, w, 1e-6).float(), rtol=tol, atol=tol)


def test_add_strided_inputs_and_bad_input():
    x = torch.randn(4, 32, 2)[:, :, 0]  # last dim not contiguous
    r = torch.randn(4, 32)
    w = torch.rand(32)
    normed, total = add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(total, r + x)
    torch.testing.assert_close(normed, rms_norm_naive(r + x, w, 1e-5), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="one shape, dtype and device"):
        add_rms_norm(x, r[:3], w, 1e-5)
    with pytest.raises(ValueError, match="one shape, dtype and device"):
        add_rms_norm(x, r.double(), w, 1e-5)
    with pytest.raises(ValueError, match="weight \\[N\\]"):
        add_rms_norm(x, r, torch.rand(31), 1e-5)


def test_strided_input_and_weight_promotion():
    x = torch.randn(4, 32, 2)[:, :, 0]  # last dim not contiguous
    w = torch.rand(32, dtype=torch.float32)
    out = rms_norm(x.bfloat16(), w, 1e-5)
    assert out.dtype == torch.float32  # bf16 activations times a float32 weight, as eager
    # the normalized value is rounded to bfloat16 before the weight: one bf16 step of tolerance
    torch.testing.assert_close(out, rms_norm_naive(x.bfloat16(), w, 1e-5), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("form, offset", [("zero_centered", 1.0), ("float32", 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 5, 100)])
def test_float32_forms_match_reference(dtype, shape, form, offset):
    """Gemma / Qwen3-Next (zero-centered weights) and Gemma 3n / Gemma 4: float32 throughout, the output in the
    input's dtype."""
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).to(dtype) * 3
    w = (torch.rand(shape[-1], generator=g) - 0.5).to(dtype)
    out = rms_norm(x, w, 1e-6, form)
    ref = rms_norm_float32_naive(x, w, 1e-6, offset)
    assert out.dtype == dtype and ref.dtype == dtype and out.shape == ref.shape
    tol = 1e-6 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    if form == "zero_centered":  # not the Llama form, which scales by the weight alone
        assert not torch.allclose(out.float(), rms_norm_naive(x, w, 1e-6).float(), atol=1e-3)
    with pytest.raises(ValueError, match="form must be one of"):
        rms_norm(x, w, 1e-6, "gemma")


@pytest.mark.parametrize(
    "model_type", ["gemma", "gemma2", "gemma3_text", "qwen3_next", "qwen3_5", "qwen3_5_moe", "gemma3n_text", "gemma4"]
)
def test_float32_form_replacements_equal_transformers_modules(model_type):
    """Every zero-centered or float32-scaled RMSNorm of these models (random weights; Gemma 4's unscaled value norms
    too) gives the module's output through the replacement, which the fused mode swaps in."""
    from arch_survey import build

    model = build(model_type)[0]
    norms = [m for m in model.modules() if type(m).__name__ in ZERO_CENTERED | FLOAT32_SCALED]
    assert norms, f"{model_type}: no zero-centered or float32 RMSNorm found"
    unscaled = [m for m in norms if getattr(m, "weight", None) is None]
    for norm in norms[:4] + unscaled[:2]:
        weight = getattr(norm, "weight", None)
        width = weight.shape[0] if weight is not None else 32
        if weight is not None:
            with torch.no_grad():
                norm.weight.copy_(torch.randn_like(norm.weight) * 0.3)
        x = torch.randn(2, 3, width)
        torch.testing.assert_close(TritonRMSNorm(norm)(x), norm(x), rtol=1e-6, atol=1e-6)
    if model_type == "gemma4":
        assert unscaled, "Gemma 4's value norms have no scale"
    with speculation_mode(model, mode=FUSED) as switched:
        assert switched.counts.get("TritonRMSNorm", 0) >= len(norms)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 64), (3, 5, 100)])
def test_gated_matches_reference(dtype, shape):
    """The gated norm of Gated DeltaNet layers: the Llama form times silu(gate) in float32."""
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g).to(dtype) * 3
    z = torch.randn(*shape, generator=g).to(dtype)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    out = rms_norm_gated(x, z, w, 1e-6)
    ref = rms_norm_gated_naive(x, z, w, 1e-6)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = 1e-6 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="one shape"):
        rms_norm_gated(x, z[..., :-1], w, 1e-6)
    with pytest.raises(ValueError, match="weight \\[N\\] of x's dtype"):
        rms_norm_gated(x, z, w.double(), 1e-6)


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"])
def test_gated_replacement_equals_transformers_module(model_type):
    """Each Gated DeltaNet layer's gated norm (random weight) gives the module's output through the replacement,
    which the fused mode swaps in."""
    from arch_survey import build

    model = build(model_type)[0]
    norms = [m for m in model.modules() if type(m).__name__ in GATED]
    assert norms, f"{model_type}: no gated RMSNorm found"
    for norm in norms[:2]:
        with torch.no_grad():
            norm.weight.copy_(torch.randn_like(norm.weight))
        x, z = torch.randn(6, norm.weight.shape[0]), torch.randn(6, norm.weight.shape[0])
        torch.testing.assert_close(TritonRMSNormGated(norm)(x, z), norm(x, z), rtol=1e-6, atol=1e-6)
    with speculation_mode(model, mode=FUSED) as switched:
        assert switched.counts.get("TritonRMSNormGated", 0) == len(norms)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_replacement_equals_transformers_module(arch):
    """Every allow-listed RMSNorm of the test architectures gives the same output through the replacement."""
    model = make_model(arch)
    norms = [m for m in model.modules() if type(m).__name__ in REPLACEABLE]
    assert norms, f"{arch}: no replaceable RMSNorm found"
    for norm in norms[:3]:
        x = torch.randn(2, 3, norm.weight.shape[0])
        torch.testing.assert_close(TritonRMSNorm(norm)(x), norm(x), rtol=1e-6, atol=1e-6)


#: the fused modules alone (no "sparse_verify" attention: these forwards run without a step)
FUSED = Mode(attention=False, fused=True)


def test_speculation_mode_swaps_norms_and_restores():
    model = make_model("qwen3")  # has q_norm / k_norm inside attention too
    before = {name: type(m).__name__ for name, m in model.named_modules()}
    ids = torch.randint(3, 90, (2, 9))
    expected = model(ids).logits
    with speculation_mode(model, mode=FUSED) as switched:
        assert switched.counts == {"TritonRMSNorm": sum(1 for n in before.values() if n in REPLACEABLE)}
        assert not any(type(m).__name__ in REPLACEABLE for m in model.modules())
        torch.testing.assert_close(model(ids).logits, expected, rtol=1e-5, atol=1e-5)
    assert {name: type(m).__name__ for name, m in model.named_modules()} == before
    with pytest.raises(RuntimeError), speculation_mode(model, mode=FUSED):
        raise RuntimeError("restored on errors too")
    assert {name: type(m).__name__ for name, m in model.named_modules()} == before


def test_bad_input():
    with pytest.raises(ValueError, match="weight \\[N\\]"):
        rms_norm(torch.randn(2, 8), torch.rand(7), 1e-6)


def test_gated_benchmark_entry_runs_quick():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["rms_norm_gated"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "eager"} and len(cases) == 6
    for case in cases:
        assert case.run().shape == (case.params["rows"], case.params["hidden"])


def test_docstring_examples():
    import doctest

    from hf_sparse_verify.kernels.rms_norm import op as op_module

    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0
