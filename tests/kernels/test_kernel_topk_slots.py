"""Top-k slot selection: Triton kernel (CPU interpreter without a GPU) against the PyTorch reference."""

from __future__ import annotations

import doctest

import pytest
import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.topk_slots import naive, op, topk_slots, topk_slots_naive
from hf_sparse_verify.kernels.topk_slots.kernel import topk_slots_triton

pytestmark = pytest.mark.skipif(not triton_runs_on(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter or CUDA)")  # fmt: skip

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_case(layers=3, length=300, ties=False, seed=0):
    """Rows that differ in pad, prefix end, count (one row keeps its whole prefix, one keeps nothing) and window."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.rand(layers, 4, length, generator=gen)
    if ties:  # few distinct values: the threshold falls inside a run of equal keys
        scores = (scores * 3).floor()
    pad = torch.tensor([0, 3, 7, 2])
    recent_start = torch.tensor([length - 5, length, length // 2, 9])
    count = torch.minimum(torch.tensor([length // 10, length // 3, 0, 7]), recent_start - pad)
    window = torch.minimum(torch.tensor([3, 0, 2, 7]), count)
    k_slots = int(count.max()) + 3
    to = dict(device=DEVICE)
    return scores.to(**to), pad.to(**to), recent_start.to(**to), count.to(**to), k_slots, window.to(**to)


@pytest.mark.parametrize("length", [17, 300, 2049, 5000])
@pytest.mark.parametrize("pool", [1, 3, 7])
@pytest.mark.parametrize("ties", [False, True])
def test_kernel_matches_reference(length, pool, ties):
    scores, pad, recent_start, count, k_slots, window = make_case(length=length, ties=ties)
    for recent in (None, window):
        expected = topk_slots_naive(scores, pad, recent_start, count, k_slots, recent, pool)
        got = topk_slots_triton(scores, pad, recent_start, count, k_slots, recent, pool)
        assert torch.equal(got, expected)


def test_reference_picks_the_best_slots_ascending_ties_lower_first():
    scores = torch.tensor([[[5.0, 1.0, 3.0, 3.0, 9.0, 3.0, 0.0, 8.0]]])  # slot 7 lies past the prefix
    got = topk_slots_naive(scores, torch.tensor([1]), torch.tensor([7]), torch.tensor([3]), 4)
    assert got.tolist() == [[[2, 3, 4, 0]]]  # 9, then two of the three 3.0s: the lower slots


def test_negative_and_mixed_sign_scores_keep_their_order():
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(2, 4, 700, generator=gen).to(DEVICE) * 1e3
    scores[0, 0, 100] = -float("inf")
    _, pad, recent_start, count, k_slots, window = make_case(layers=2, length=700)
    got = topk_slots_triton(scores, pad, recent_start, count, k_slots, window, 1)
    assert torch.equal(got, topk_slots_naive(scores, pad, recent_start, count, k_slots, window, 1))


def test_strided_layers_are_read_in_place():
    scores, pad, recent_start, count, k_slots, window = make_case(length=400)
    wide = torch.zeros(3, 4, 512, device=DEVICE)
    wide[..., :400] = scores
    view = wide[..., :400]  # rows 512 apart
    got = topk_slots_triton(view, pad, recent_start, count, k_slots, window, 3)
    assert torch.equal(got, topk_slots_naive(scores, pad, recent_start, count, k_slots, window, 3))


def test_op_dispatch_and_errors():
    scores, pad, recent_start, count, k_slots, window = make_case(length=64)
    expected = topk_slots_naive(scores, pad, recent_start, count, k_slots, window, 3)
    for kernel in (True, False):
        got = topk_slots(scores, pad, recent_start, count, k_slots, window, 3, kernel=kernel)
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="pool must be odd"):
        topk_slots(scores, pad, recent_start, count, k_slots, window, 4)
    with pytest.raises(ValueError, match="k_slots must be in"):
        topk_slots(scores, pad, recent_start, count, 0)
    with pytest.raises(ValueError, match="count must be int64"):
        topk_slots(scores, pad, recent_start, count.int(), k_slots)
    with pytest.raises(ValueError, match=r"scores must be a float \[N, B, L\]"):
        topk_slots(scores[0], pad, recent_start, count, k_slots)


@pytest.mark.parametrize("module", [naive, op])
def test_doctests(module):
    assert doctest.testmod(module, raise_on_error=True).attempted > 0
