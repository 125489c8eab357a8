"""Sparse MLA attention (DSA over latent caches): the merged schedule against set arithmetic, the Triton kernel
(CPU interpreter without a GPU) against the dense float64 reference."""

from __future__ import annotations

import doctest

import pytest
import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.sparse_mla import (
    kernel,
    merged_selection,
    naive,
    per_query_selection,
    selection_mask,
    sparse_mla,
    sparse_mla_naive,
)
from hf_sparse_verify.kernels.sparse_mla.kernel import sparse_mla_triton

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")) and not torch.cuda.is_available(),
    reason="needs Triton (interpreter or CUDA)",
)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def make_case(
    batch=2, q_len=4, heads=5, lat=32, rot=8, capacity=64, length=50, topk=12, dtype=torch.float32, seed=0
):
    """Random queries and cache; row 1 left-padded by 7 slots; causal verify window at the end of ``length``; each
    query's indexer picks ``topk`` distinct slots among all ``length`` (some of them masked, as DSA's top-k does
    where fewer slots are valid)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    slot = torch.arange(length)
    query_slot = length - q_len + torch.arange(q_len)
    allowed = (slot[None, None, :] <= query_slot[None, :, None]).expand(batch, q_len, length).clone()
    allowed[1, :, :7] = False
    indices = torch.stack(
        [
            torch.stack([torch.randperm(length, generator=gen)[:topk] for _ in range(q_len)])
            for _ in range(batch)
        ]
    )
    return dict(
        q_lat=rand(batch, q_len, heads, lat),
        q_rot=rand(batch, q_len, heads, rot),
        latent=rand(batch, capacity, lat),
        rot=rand(batch, capacity, rot),
        indices=indices.to(DEVICE, torch.int32),
        allowed=allowed.to(DEVICE),
        scaling=(lat + rot) ** -0.5,
    )


def reference(case) -> torch.Tensor:
    """The dense reference in float64, over exactly the selected and allowed slots."""
    attend = selection_mask(case["indices"], case["allowed"])
    d = {k: case[k].double() for k in ("q_lat", "q_rot", "latent", "rot")}
    return sparse_mla_naive(d["q_lat"], d["q_rot"], d["latent"], d["rot"], attend, case["scaling"])


def test_doctests():
    assert doctest.testmod(naive).failed == 0


def test_merged_selection_is_the_union_with_one_bit_per_chooser():
    case = make_case(batch=3, q_len=6, length=40, topk=9, seed=3)
    case["allowed"][2, 3:, :] = False  # queries that may attend nothing
    slots, bits, count = merged_selection(case["indices"], case["allowed"])
    assert slots.shape == bits.shape == (3, min(40, 6 * 9))
    for b in range(3):
        chosen = {}
        for i in range(6):
            for s in case["indices"][b, i].tolist():
                if case["allowed"][b, i, s]:
                    chosen[s] = chosen.get(s, 0) | (1 << i)
        n = int(count[b])
        assert slots[b, :n].tolist() == sorted(chosen)
        assert bits[b, :n].tolist() == [chosen[s] for s in sorted(chosen)]
        assert not bits[b, n:].any() and not slots[b, n:].any()


def test_merged_selection_refuses_windows_its_bits_cannot_hold():
    case = make_case(q_len=naive.MAX_MERGED_QUERIES + 1, length=40, topk=4)
    with pytest.raises(ValueError, match="queries per step"):
        merged_selection(case["indices"], case["allowed"])


def test_selection_mask_drops_indices_past_the_read_slots():
    allowed = torch.ones(1, 1, 5, dtype=torch.bool)
    mask = selection_mask(torch.tensor([[[1, 9]]]), allowed)
    assert mask[0, 0].tolist() == [False, True, False, False, False]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len,heads,splits", [(1, 5, 1), (1, 5, 3), (4, 5, 2), (8, 3, 1), (5, 7, 4)])
def test_kernel_matches_reference(dtype, q_len, heads, splits):
    case = make_case(q_len=q_len, heads=heads, dtype=dtype, seed=q_len * 10 + heads)
    slots, bits, count = merged_selection(case["indices"], case["allowed"])
    out = sparse_mla_triton(
        case["q_lat"], case["q_rot"], case["latent"], case["rot"], slots, bits, count, case["scaling"], splits
    )
    torch.testing.assert_close(out.double(), reference(case), atol=TOL[dtype], rtol=TOL[dtype])


@needs_triton
@pytest.mark.parametrize("q_len,splits", [(1, 1), (1, 3), (4, 2)])
def test_per_query_schedule_reads_each_querys_own_selection(q_len, splits):
    case = make_case(q_len=q_len, heads=6, seed=5)
    case["allowed"][0, :, :20] = False  # some chosen slots masked
    slots, bits, count = per_query_selection(case["indices"], case["allowed"])
    assert torch.equal(slots, case["indices"].reshape(2 * q_len, -1).int()) and count.tolist() == [12] * (
        2 * q_len
    )
    flat = (case[k].reshape(2 * q_len, 1, *case[k].shape[2:]) for k in ("q_lat", "q_rot"))
    out = sparse_mla_triton(
        *flat, case["latent"], case["rot"], slots, bits, count, case["scaling"], splits, kv_share=q_len
    )
    torch.testing.assert_close(out.view(case["q_lat"].shape).double(), reference(case), atol=1e-4, rtol=1e-4)


@needs_triton
@pytest.mark.parametrize("schedule", ["per_query", "merged"])
def test_both_schedules_through_the_op(schedule):
    case = make_case(q_len=5, heads=3, seed=9)
    out = sparse_mla(**case, schedule=schedule)
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


@needs_triton
def test_kernel_reads_a_strided_cache_and_a_query_that_attends_nothing():
    case = make_case(q_len=3, heads=4, seed=7)
    cache = torch.randn(2, 1, 64, 32 + 8, device=DEVICE)  # latent and rotary parts side by side in one buffer
    case["latent"], case["rot"] = cache[:, 0, :, :32], cache[:, 0, :, 32:]
    case["allowed"][0, 1] = False
    out = sparse_mla(**case)
    expected = reference(case)
    torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-4)
    assert not out[0, 1].any()


@needs_triton
def test_tile_rows_spanning_head_blocks_do_not_write_other_heads(monkeypatch):
    """3 heads per block of a 5-query step leave a padded 16th tile row; with splits, the merge must skip it (its
    stray write lands on a head of the next block: the interpreter runs that block later, which overwrites it, so
    this catches the fault on a GPU only)."""
    monkeypatch.setitem(kernel.TILES, "rows", 15)
    case = make_case(q_len=5, heads=7, seed=11)
    slots, bits, count = merged_selection(case["indices"], case["allowed"])
    out = sparse_mla_triton(
        case["q_lat"], case["q_rot"], case["latent"], case["rot"], slots, bits, count, case["scaling"], 3
    )
    torch.testing.assert_close(out.double(), reference(case), atol=1e-4, rtol=1e-4)


def test_op_refuses_mismatched_inputs():
    case = make_case()
    with pytest.raises(ValueError, match="latent/rot widths"):
        sparse_mla(**{**case, "latent": case["latent"][..., :16]})
    with pytest.raises(ValueError, match="allowed must be bool"):
        sparse_mla(**{**case, "allowed": case["allowed"].int()})
    with pytest.raises(ValueError, match="indices must be int"):
        sparse_mla(**{**case, "indices": case["indices"].float()})
    with pytest.raises(ValueError, match="schedule must be one of"):
        sparse_mla(**case, schedule="union")
