"""DSA index scores: the Triton kernel (CPU interpreter without a GPU) against the float32 reference, on odd shapes,
strided cache views and both dtypes; the reference against transformers' order of operations."""

from __future__ import annotations

import doctest

import pytest
import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.index_scores import index_scores, index_scores_naive, naive
from hf_sparse_verify.kernels.index_scores.kernel import index_scores_triton

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")) and not torch.cuda.is_available(),
    reason="needs Triton (interpreter or CUDA)",
)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(batch, q_len, heads, dim, length, dtype, seed=0, spare=5):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, dim, generator=gen).to(DEVICE, dtype)
    cache = torch.randn(batch, length + spare, dim, generator=gen).to(DEVICE, dtype)  # a cache buffer's first L
    weights = torch.randn(batch, q_len, heads, generator=gen).to(DEVICE)
    return q, cache[:, :length], weights


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch,q_len,heads,dim,length",
    [(1, 1, 64, 128, 257), (2, 8, 4, 32, 63), (3, 9, 5, 20, 130), (1, 31, 64, 128, 500), (2, 3, 2, 16, 1)],
)
def test_kernel_matches_reference(batch, q_len, heads, dim, length, dtype):
    q, keys, weights = _case(batch, q_len, heads, dim, length, dtype)
    expected = index_scores_naive(q, keys, weights, dim**-0.5)
    got = index_scores_triton(q, keys, weights, dim**-0.5)
    assert got.dtype == torch.float32 and got.shape == (batch, q_len, length)
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max()) + 1e-6
    # the op takes the kernel where Triton runs, with weights cast to float32
    assert torch.allclose(index_scores(q, keys, weights.half(), dim**-0.5), index_scores_naive(
        q, keys, weights.half(), dim**-0.5), rtol=1e-5, atol=1e-5)  # fmt: skip


@needs_triton
def test_every_score_is_written(monkeypatch):
    """Poisoned output (the launcher's buffer filled with NaN): a shape whose last key block and query block are
    partial still writes every score."""
    from hf_sparse_verify.kernels.index_scores import kernel

    real_empty = torch.empty
    monkeypatch.setattr(kernel.torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    q, keys, weights = _case(2, 11, 3, 24, 67, torch.float32)
    got = index_scores_triton(q, keys, weights, 0.3)
    assert bool(torch.isfinite(got).all())


def test_reference_is_transformers_order_of_operations():
    """The reference computes what the DeepSeek-V3.2 indexer computes after its projections (transformers 5.24.0):
    float32 per-head dots, scaled, ReLU, weighted sum over heads."""
    q, keys, weights = _case(2, 4, 3, 16, 9, torch.bfloat16)
    per_head = torch.einsum("bshd,btd->bsht", q.float(), keys.float()) * 0.25
    expected = (per_head.clamp_min(0) * weights.unsqueeze(-1)).sum(2)
    assert torch.allclose(index_scores_naive(q, keys, weights, 0.25), expected, atol=1e-5)


def test_bad_shapes_say_what_is_expected():
    q, keys, weights = _case(1, 2, 3, 16, 9, torch.float32)
    with pytest.raises(ValueError, match=r"q \[B, S, H, D\]"):
        index_scores(q[0], keys, weights, 1.0)
    with pytest.raises(ValueError, match="do not match"):
        index_scores(q, keys[..., :8], weights, 1.0)


def test_docstring_examples():
    assert doctest.testmod(naive).failed == 0


def test_benchmark_entry_runs_quick():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["index_scores"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "reference"} and len(cases) == 4
    for case in cases:
        if case.variant == "reference" or triton_runs_on(torch.device("cpu")):
            assert case.run().shape == (1, case.params["q_len"], case.params["context"])
