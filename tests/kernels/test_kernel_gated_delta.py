"""The gated delta rule over a verify window: the reference against transformers' own one-token recurrence (state
after every token), the Triton kernel against the reference (interpreted on CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.gated_delta import gated_delta_window, gated_delta_window_naive

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _inputs(batch, width, heads_k, heads_v, d_k, d_v, dtype=torch.float32, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, width, heads_k, d_k, generator=gen)
    k = torch.randn(batch, width, heads_k, d_k, generator=gen)
    v = torch.randn(batch, width, heads_v, d_v, generator=gen)
    g = -torch.rand(batch, width, heads_v, generator=gen) * 2  # log decay <= 0
    beta = torch.rand(batch, width, heads_v, generator=gen)
    state = torch.randn(batch, heads_v, d_k, d_v, generator=gen) * 0.3
    cast = [x.to(dtype) for x in (q, k, v)] + [g, beta.to(dtype), state]
    return [x.to(device) for x in cast]


@pytest.mark.parametrize("shape", [(1, 5, 1, 2, 8, 8), (2, 3, 2, 4, 16, 8), (3, 1, 2, 2, 8, 32)])
def test_reference_is_transformers_recurrence_token_by_token(shape):
    """Each token's output and state equal transformers' recurrent rule called on that token from the previous
    state (as plain ``generate`` decodes): the same arithmetic, so equal up to float32 rounding."""
    q, k, v, g, beta, state = _inputs(*shape)
    out, states = gated_delta_window_naive(q, k, v, g, beta, state)
    s = state
    for t in range(shape[1]):
        token = slice(t, t + 1)
        o, s = torch_recurrent_gated_delta_rule(q[:, token], k[:, token], v[:, token], g=g[:, token],
                                                beta=beta[:, token], initial_state=s, output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)  # fmt: skip
        torch.testing.assert_close(out[:, token], o, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(states[:, t], s, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not triton_runs_on(DEVICE), reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 5, 1, 2, 8, 8), (2, 4, 2, 4, 16, 32), (2, 3, 1, 1, 12, 20), (1, 2, 2, 2, 128, 128)])
def test_kernel_matches_reference(dtype, shape):
    """Odd head sizes (12, 20) exercise the masks; 128 x 128 splits the values over programs."""
    inputs = _inputs(*shape, dtype=dtype, seed=sum(shape), device=DEVICE)
    out, states = gated_delta_window(*inputs)
    ref_out, ref_states = gated_delta_window_naive(*inputs)
    assert out.dtype == dtype and states.dtype == torch.float32 and states.shape == ref_states.shape
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(states, ref_states, rtol=1e-5, atol=1e-5)


def test_bad_shapes_say_what_to_change():
    q, k, v, g, beta, state = _inputs(1, 3, 2, 3, 8, 8)[:6] if False else _inputs(1, 3, 1, 3, 8, 8)
    with pytest.raises(ValueError, match="multiple of key heads"):
        gated_delta_window(torch.cat([q, q], 2), torch.cat([k, k], 2), v, g, beta, state)
    with pytest.raises(ValueError, match="state must be"):
        gated_delta_window(q, k, v, g, beta, state[:, :, :4])
    with pytest.raises(ValueError, match="g and beta"):
        gated_delta_window(q, k, v, g[:, :2], beta, state)


def test_benchmark_entry_runs_quick():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["gated_delta"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "reference"} and len(cases) == 8
    for case in cases:
        if case.variant == "reference" or triton_runs_on(torch.device("cpu")):
            out, states = case.run()
            assert states.dtype == torch.float32


def test_docstring_example():
    import doctest

    from hf_sparse_verify.kernels.gated_delta import op as op_module

    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0
