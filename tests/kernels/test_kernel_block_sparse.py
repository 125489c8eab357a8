"""Block-sparse verify attention: Triton (interpreted on CPU) vs the float64 reference, the reference vs a
brute-force loop over slots, sparsity 0 = dense causal attention, forced sink/local blocks, the merged schedule,
the custom op and input checks."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

import hf_sparse_verify.kernels.block_sparse.op as op_module
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.block_sparse import (
    block_sparse_attention,
    block_sparse_attention_naive,
    merge_query_blocks,
)
from hf_sparse_verify.kernels.block_sparse.kernel import block_sparse_attention_triton

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def make_inputs(b, h, h_kv, q_len, d, capacity, block_size, n_list, dtype=torch.float32, seed=0, starts=None):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(b, q_len, h, d, generator=gen).to(dtype).transpose(1, 2)  # [B, H, q, D] view
    key = torch.randn(b, h_kv, capacity, d, generator=gen).to(dtype)
    value = torch.randn(b, h_kv, capacity, d, generator=gen).to(dtype)
    if starts is None:
        starts = [capacity - q_len - 7 * r for r in range(b)]
    start = torch.tensor(starts)
    pad = torch.tensor([(23 * r + 3) % max(1, s) for r, s in enumerate(starts)])
    num_blocks = -(-capacity // block_size)
    index = torch.stack(
        [torch.randperm(num_blocks, generator=gen)[:n_list].sort().values for _ in range(b * h_kv)]
    ).reshape(b, h_kv, n_list)
    count = torch.randint(0, n_list + 1, (b, h_kv), generator=gen)
    return query, key, value, start, pad, index.to(torch.int32), count.to(torch.int32)


def run_triton(query, key, value, start, pad, index, count, block_size, scale, query_mask=None, num_splits=0):
    b, h, q_len, d = query.shape
    out = torch.full((b, q_len, h, d), float("nan"), dtype=query.dtype)  # poisoned
    return block_sparse_attention_triton(
        query, key, value, start, pad, index, count, block_size, scale, query_mask, num_splits, out=out
    )


def reference(query, key, value, start, pad, index, count, block_size, scale, query_mask=None):
    return block_sparse_attention_naive(
        query.double(), key.double(), value.double(), start, pad, index, count, block_size, scale, query_mask
    )


def brute_force(query, key, value, start, pad, index, count, block_size, scale, query_mask=None):
    """Loops over every (row, head, query, slot) with the rule written out; float64."""
    b, h, q_len, d = query.shape
    h_kv, capacity = key.shape[1], key.shape[2]
    out = torch.zeros(b, q_len, h, d, dtype=torch.float64)
    for r in range(b):
        s0, p0 = int(start[r]), int(pad[r])
        forced = {p0 // block_size} | set(range(s0 // block_size, (s0 + q_len - 1) // block_size + 1))
        for hq in range(h):
            hk = hq // (h // h_kv)
            for i in range(q_len):
                chosen = {
                    int(index[r, hk, n])
                    for n in range(int(count[r, hk]))
                    if query_mask is None or bool(query_mask[r, hk, i, n])
                }
                slots = [
                    s for s in range(capacity) if (s // block_size in chosen | forced) and p0 <= s <= s0 + i
                ]
                if not slots:
                    continue
                k = key[r, hk, slots].double()
                v = value[r, hk, slots].double()
                w = torch.softmax(k @ query[r, hq, i].double() * scale, dim=0)
                out[r, i, hq] = w @ v
    return out


def dense_causal(query, key, value, start, pad, scale):
    """Plain attention over slots pad..start+i, through SDPA with GQA."""
    b, h, q_len, d = query.shape
    capacity = key.shape[2]
    slots = torch.arange(capacity)
    q_pos = start[:, None] + torch.arange(q_len)  # [B, q]
    mask = (slots <= q_pos[..., None]) & (slots >= pad[:, None, None])  # [B, q, C]
    out = F.scaled_dot_product_attention(
        query.double(), key.double(), value.double(), attn_mask=mask[:, None], scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2)


def assert_close(out, ref, dtype):
    assert not torch.isnan(out).any(), "unwritten (NaN) outputs"
    tol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=tol)


@needs_triton
@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("q_len", [1, 4, 7])
def test_triton_matches_reference_gqa_and_q(group, q_len):
    h_kv = 2
    args = make_inputs(3, h_kv * group, h_kv, q_len, 32, 100, 16, 4, seed=group * 10 + q_len)
    scale = 1 / math.sqrt(32)
    ref = reference(*args, 16, scale)
    assert_close(run_triton(*args, 16, scale), ref, torch.float32)
    mask = torch.rand(3, h_kv, q_len, 4, generator=torch.Generator().manual_seed(q_len)) < 0.6
    ref = reference(*args, 16, scale, mask)
    assert_close(run_triton(*args, 16, scale, mask, num_splits=3), ref, torch.float32)


@needs_triton
@pytest.mark.parametrize(
    "dtype,d,capacity,block_size,num_splits",
    [
        (torch.float32, 16, 37, 16, 1),
        (torch.float32, 24, 100, 32, 2),
        (torch.bfloat16, 64, 100, 16, 0),
        (torch.float16, 32, 130, 32, 5),
    ],
)
def test_triton_dtypes_shapes_splits(dtype, d, capacity, block_size, num_splits):
    args = make_inputs(2, 4, 2, 4, d, capacity, block_size, 3, dtype=dtype, seed=d + capacity)
    scale = 0.7 / math.sqrt(d)
    ref = reference(*args, block_size, scale)
    assert_close(run_triton(*args, block_size, scale, num_splits=num_splits), ref, dtype)


def test_reference_matches_brute_force():
    args = make_inputs(3, 4, 2, 5, 8, 70, 16, 3, seed=1)
    mask = torch.rand(3, 2, 5, 3, generator=torch.Generator().manual_seed(2)) < 0.5
    for query_mask in (None, mask):
        ref = reference(*args, 16, 0.3, query_mask)
        torch.testing.assert_close(ref, brute_force(*args, 16, 0.3, query_mask))


@pytest.mark.parametrize("use_triton", [False, pytest.param(True, marks=needs_triton)])
def test_all_blocks_selected_is_dense_causal(use_triton):
    capacity, block_size = 100, 16
    num_blocks = -(-capacity // block_size)
    query, key, value, start, pad, _, _ = make_inputs(3, 4, 2, 4, 16, capacity, block_size, 1, seed=3)
    index = torch.arange(num_blocks, dtype=torch.int32).expand(3, 2, num_blocks).contiguous()
    count = torch.full((3, 2), num_blocks, dtype=torch.int32)
    run = run_triton if use_triton else reference
    out = run(query, key, value, start, pad, index, count, block_size, 0.25)
    torch.testing.assert_close(
        out.double(), dense_causal(query, key, value, start, pad, 0.25), rtol=1e-4, atol=1e-4
    )


@needs_triton
def test_count_zero_attends_only_forced_blocks():
    block_size = 16
    query, key, value, start, pad, index, _ = make_inputs(3, 4, 2, 3, 16, 100, block_size, 4, seed=4)
    count = torch.zeros(3, 2, dtype=torch.int32)
    ref = brute_force(query, key, value, start, pad, index, count, block_size, 0.25)
    assert_close(
        run_triton(query, key, value, start, pad, index, count, block_size, 0.25, num_splits=2),
        ref,
        torch.float32,
    )
    # the same as listing exactly the forced blocks
    forced = [
        sorted({int(p) // block_size, int(s) // block_size, (int(s) + 2) // block_size})
        for s, p in zip(start, pad)
    ]
    n = max(map(len, forced))
    listed = torch.tensor([f + [0] * (n - len(f)) for f in forced], dtype=torch.int32)[:, None]
    listed_count = torch.tensor([len(f) for f in forced], dtype=torch.int32)[:, None]
    args = (query, key, value, start, pad, listed.expand(3, 2, n), listed_count.expand(3, 2))
    torch.testing.assert_close(reference(*args, block_size, 0.25), ref)


@needs_triton
def test_forced_blocks_listed_are_used_once():
    """List the sink and local blocks explicitly: the kernel must not count them twice."""
    block_size, q_len = 16, 7
    query, key, value, _, _, _, _ = make_inputs(2, 2, 1, q_len, 16, 100, block_size, 1, seed=5)
    start, pad = torch.tensor([60, 90]), torch.tensor([20, 0])  # row 0: local blocks 3, 4; row 1: 5, 6
    index = torch.tensor([[[1, 2, 3, 4, 5]], [[0, 3, 5, 6, 0]]], dtype=torch.int32)
    count = torch.tensor([[5], [4]], dtype=torch.int32)
    ref = brute_force(query, key, value, start, pad, index, count, block_size, 0.25)
    for splits in (1, 3):
        assert_close(
            run_triton(query, key, value, start, pad, index, count, block_size, 0.25, num_splits=splits),
            ref,
            torch.float32,
        )


@needs_triton
def test_batch_rows_with_different_start_and_pad():
    args = make_inputs(3, 8, 2, 4, 32, 120, 32, 2, seed=6, starts=[116, 40, 5])
    ref = reference(*args, 32, 0.2)
    assert_close(run_triton(*args, 32, 0.2), ref, torch.float32)
    torch.testing.assert_close(ref, brute_force(*args, 32, 0.2))


@needs_triton
def test_merged_all_true_equals_shared_index():
    args = make_inputs(2, 4, 2, 4, 16, 100, 16, 4, seed=7)
    mask = torch.ones(2, 2, 4, 4, dtype=torch.bool)
    shared = run_triton(*args, 16, 0.25)
    merged = run_triton(*args, 16, 0.25, mask)
    torch.testing.assert_close(merged, shared, rtol=1e-6, atol=1e-6)


def test_merge_query_blocks_keeps_per_query_sets():
    gen = torch.Generator().manual_seed(8)
    b, h_kv, q_len, k, num_blocks = 2, 2, 3, 3, 7
    query_index = torch.randint(0, num_blocks, (b, h_kv, q_len, k), generator=gen)
    query_count = torch.randint(0, k + 1, (b, h_kv, q_len), generator=gen)
    index, count, mask = merge_query_blocks(query_index, query_count, num_blocks)
    n = min(num_blocks, q_len * k)
    assert index.shape == (b, h_kv, n) and mask.shape == (b, h_kv, q_len, n)
    for r in range(b):
        for h in range(h_kv):
            listed = index[r, h, : count[r, h]].tolist()
            assert listed == sorted(set(listed))
            for i in range(q_len):
                want = set(query_index[r, h, i, : query_count[r, h, i]].tolist())
                got = {listed[n] for n in range(len(listed)) if mask[r, h, i, n]}
                assert got == want
            assert not mask[r, h, :, count[r, h] :].any()


@needs_triton
def test_custom_op_and_opcheck():
    args = make_inputs(2, 4, 2, 3, 16, 50, 16, 2, seed=9)
    mask = torch.rand(2, 2, 3, 2, generator=torch.Generator().manual_seed(9)) < 0.5
    out = torch.ops.hsv.block_sparse_attention(*args, mask, 16, 0.25, 0)
    assert_close(out, reference(*args, 16, 0.25, mask), torch.float32)
    torch.library.opcheck(torch.ops.hsv.block_sparse_attention.default, (*args, None, 16, 0.25, 2))


def test_docstring_example():
    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: {**a, "key": a["key"][..., :8], "value": a["value"][..., :8]}, "head_dim"),
        (lambda a: {**a, "query": a["query"][:, :3]}, "multiple of KV heads"),
        (lambda a: {**a, "key": a["key"].half(), "value": a["value"].half()}, "one dtype of float16"),
        (
            lambda a: {k: v.double() if k in ("query", "key", "value") else v for k, v in a.items()},
            "float16/",
        ),
        (lambda a: {**a, "start": a["start"].float()}, "start must be"),
        (lambda a: {**a, "block_index": a["block_index"][0]}, "block_index must be"),
        (lambda a: {**a, "block_count": a["block_count"][:, :1]}, "block_count must be"),
        (lambda a: {**a, "query_mask": torch.ones(2, 2, 3, 5, dtype=torch.bool)}, "query_mask must be"),
        (lambda a: {**a, "block_size": 24}, "power of two"),
    ],
)
def test_bad_input_messages(change, message):
    query, key, value, start, pad, index, count = make_inputs(2, 4, 2, 3, 16, 50, 16, 2)
    good = dict(
        query=query,
        key=key,
        value=value,
        start=start,
        pad=pad,
        block_index=index,
        block_count=count,
        block_size=16,
    )
    with pytest.raises(ValueError, match=message):
        block_sparse_attention(**change(good))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("q_len", [1, 16])
def test_cuda_real_size(q_len):
    torch.manual_seed(0)
    capacity, block_size, n = 8192, 64, 12
    query = torch.randn(1, 32, q_len, 128, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(1, 8, capacity, 128, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    start = torch.tensor([capacity - q_len], device="cuda")
    pad = torch.tensor([100], device="cuda")
    index = torch.stack([torch.randperm(capacity // block_size)[:n].sort().values for _ in range(8)])
    index = index.reshape(1, 8, n).to("cuda", torch.int32)
    count = torch.full((1, 8), n, device="cuda", dtype=torch.int32)
    mask = torch.rand(1, 8, q_len, n, device="cuda") < 0.8
    for query_mask in (None, mask):
        out = block_sparse_attention(
            query, key, value, start, pad, index, count, block_size=block_size, query_mask=query_mask
        )
        ref = block_sparse_attention_naive(
            query.float(),
            key.float(),
            value.float(),
            start,
            pad,
            index,
            count,
            block_size,
            1 / math.sqrt(128),
            query_mask,
        )
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
