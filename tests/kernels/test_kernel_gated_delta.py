"""The gated delta rule over a verify window: the reference against transformers' own one-token recurrence (state
after every token), the Triton kernel against the reference (interpreted on CPU, compiled on a GPU), on a ring of
states as the cache keeps them (wrapping around, rows at different slots, a bfloat16 ring)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.gated_delta import (
    gated_delta_ring,
    gated_delta_ring_naive,
    gated_delta_window,
    gated_delta_window_naive,
)

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
    if importlib.util.find_spec("fla") is not None:  # transformers then dispatches its function to fla's kernel
        pytest.skip("transformers' recurrence runs flash-linear-attention's GPU kernel here (fla installed)")
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


@pytest.mark.parametrize("ring_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("every_state", [True, False])
def test_ring_reference_reads_and_writes_the_right_slots(ring_dtype, every_state):
    """Row 0 starts at slot 6 of 8 (its window wraps to slot 0), row 1 at slot 2: each reads the state before its
    first slot and leaves the state after each token at that token's slot (only the last with every_state=False);
    no other slot changes."""
    q, k, v, g, beta, _ = _inputs(2, 3, 1, 2, 8, 8)
    ring = (torch.randn(2, 8, 2, 8, 8) * 0.3).to(ring_dtype)
    start = torch.tensor([6, 2])
    before = ring.clone()
    out = gated_delta_ring_naive(q, k, v, g, beta, ring, start, every_state)
    for row, (read, written) in enumerate([(5, [6, 7, 0]), (1, [2, 3, 4])]):
        ref_out, ref_states = gated_delta_window_naive(
            q[row : row + 1], k[row : row + 1], v[row : row + 1], g[row : row + 1], beta[row : row + 1],
            before[row : row + 1, read],
        )  # fmt: skip
        torch.testing.assert_close(out[row : row + 1], ref_out)
        kept = written if every_state else written[-1:]
        for slot in range(8):
            if slot in kept:
                expected = ref_states[0, written.index(slot)].to(ring_dtype)
            else:
                expected = before[row, slot]
            torch.testing.assert_close(ring[row, slot], expected)


@pytest.mark.skipif(not triton_runs_on(DEVICE), reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
@pytest.mark.parametrize("ring_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("every_state", [True, False])
def test_ring_kernel_matches_reference(ring_dtype, every_state):
    q, k, v, g, beta, _ = _inputs(3, 4, 2, 4, 16, 32, device=DEVICE)
    ring = (torch.randn(3, 6, 4, 16, 32, device=DEVICE) * 0.3).to(ring_dtype)
    start = torch.tensor([5, 0, 3], device=DEVICE)
    ref_ring = ring.clone()
    out = gated_delta_ring(q, k, v, g, beta, ring, start, every_state)
    ref_out = gated_delta_ring_naive(q, k, v, g, beta, ref_ring, start, every_state)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    tol = 1e-5 if ring_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ring.float(), ref_ring.float(), rtol=tol, atol=tol)


def test_bad_shapes_say_what_to_change():
    q, k, v, g, beta, state = _inputs(1, 3, 1, 3, 8, 8)
    with pytest.raises(ValueError, match="multiple of key heads"):
        gated_delta_window(torch.cat([q, q], 2), torch.cat([k, k], 2), v, g, beta, state)
    with pytest.raises(ValueError, match="state must be"):
        gated_delta_window(q, k, v, g, beta, state[:, :, :4])
    with pytest.raises(ValueError, match="g and beta"):
        gated_delta_window(q, k, v, g[:, :2], beta, state)
    ring, start = torch.zeros(1, 4, 3, 8, 8), torch.tensor([0])
    with pytest.raises(ValueError, match="use R >= W"):
        gated_delta_ring(q, k, v, g, beta, ring[:, :2], start)
    with pytest.raises(ValueError, match="ring must be"):
        gated_delta_ring(q, k, v, g, beta, ring[..., :4], start)
    with pytest.raises(ValueError, match="start must be"):
        gated_delta_ring(q, k, v, g, beta, ring, start.float())


def test_benchmark_entry_runs_quick():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["gated_delta"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "triton_last_state", "reference"} and len(cases) == 12
    for case in cases:
        if case.variant == "reference" or triton_runs_on(torch.device("cpu")):
            assert case.run().shape[1] == case.params["width"]


def test_docstring_example():
    import doctest

    from hf_sparse_verify.kernels.gated_delta import op as op_module

    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0
