"""Block summaries: the Triton kernels (interpreted on CPU) against the float64 references, the references
against dense masked computations, an incremental update over a simulated decode with rollbacks, selection
invariants, the layer-batched scoring, the custom ops and input errors."""

from __future__ import annotations

import pytest
import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.block_summary import (
    build_block_summaries,
    score_blocks,
    select_top_blocks,
    update_block_summaries,
)
from hf_sparse_verify.kernels.block_summary.naive import (
    max_touched_blocks,
    naive_build_block_summaries,
    naive_score_blocks,
    naive_select_top_blocks,
    naive_update_block_summaries,
    num_blocks,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}

pytestmark = pytest.mark.skipif(
    not triton_runs_on(DEVICE), reason="Triton cannot run here (no CUDA and TRITON_INTERPRET unset)"
)


def _keys(batch, kv_heads, capacity, dim, dtype, seed=0):
    """A non-contiguous ``[B, H_kv, C, D]`` view, as transformers' caches often hand out."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randn(batch, capacity, kv_heads, dim, generator=gen) + 0.5
    return raw.to(DEVICE, dtype).transpose(1, 2)


def _pos(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def _close(actual, expected, dtype):
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------ references


def test_naive_build_equals_dense_masked_mean():
    keys = _keys(3, 2, 37, 16, torch.float32)
    pad, length, bs = _pos([0, 3, 11]), _pos([37, 20, 12]), 8
    slot = torch.arange(37, device=DEVICE)
    valid = (slot >= pad[:, None]) & (slot < length[:, None])  # [B, C]
    nb = num_blocks(37, bs)
    padded = torch.zeros(3, 2, nb * bs, 16, dtype=torch.float64, device=DEVICE)
    padded[:, :, :37] = keys.double() * valid[:, None, :, None]
    weight = torch.zeros(3, nb * bs, dtype=torch.float64, device=DEVICE)
    weight[:, :37] = valid.double()
    sums = padded.view(3, 2, nb, bs, 16).sum(3)
    counts = weight.view(3, nb, bs).sum(2)[:, None, :, None]
    dense = torch.where(counts > 0, sums / counts.clamp(min=1), 0.0)
    torch.testing.assert_close(naive_build_block_summaries(keys, pad, length, bs), dense)


def test_naive_score_equals_dense_gqa():
    gen = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, nb, dim, bs = 2, 8, 2, 7, 16, 4
    query = torch.randn(batch, heads, dim, generator=gen, dtype=torch.float64)
    mean_key = torch.randn(batch, kv_heads, nb, dim, generator=gen, dtype=torch.float64)
    pad, length = torch.tensor([0, 5]), torch.tensor([26, 17])
    per_head = (
        torch.einsum("bhd,bhnd->bhn", query, mean_key.repeat_interleave(heads // kv_heads, dim=1)) * 0.3
    )
    dense = per_head.view(batch, kv_heads, heads // kv_heads, nb).sum(2)
    j = torch.arange(nb)
    valid = ((j + 1) * bs > pad[:, None]) & (j * bs < length[:, None])
    dense = dense.masked_fill(~valid[:, None], float("-inf"))
    torch.testing.assert_close(naive_score_blocks(query, mean_key, pad, length, bs, 0.3), dense)
    assert valid[1].tolist() == [False, True, True, True, True, False, False]


# --------------------------------------------------------------------------------- build / update


@pytest.mark.parametrize(
    "capacity,dim,bs,dtype",
    [
        (37, 16, 8, torch.float32),
        (100, 32, 16, torch.bfloat16),
        (64, 48, 4, torch.float16),
        (23, 64, 32, torch.float32),
    ],
)
def test_build_matches_naive(capacity, dim, bs, dtype):
    keys = _keys(3, 2, capacity, dim, dtype, seed=capacity)
    pad = _pos([0, 5, capacity // 2], torch.int32)
    length = _pos([capacity, capacity - 3, capacity // 2 + 1], torch.int32)
    expected = naive_build_block_summaries(keys, pad, length, bs)
    _close(build_block_summaries(keys, pad, length, bs), expected, dtype)

    from hf_sparse_verify.kernels.block_summary.kernel import launch_build

    out = torch.full_like(expected, float("nan"), dtype=torch.float32)
    launch_build(keys, pad, length, bs, out)
    _close(out, expected, dtype)
    assert (out[2, :, : (capacity // 2) // bs] == 0).all()  # blocks in the left padding


@pytest.mark.parametrize("dim,bs,dtype", [(16, 8, torch.float32), (32, 4, torch.bfloat16)])
def test_update_over_decode_with_rollbacks(dim, bs, dtype):
    """Prefill, then steps that write ``q_len`` keys at per-row ``start`` (rolled back onto rejected drafts);
    after every step the incremental summaries equal a from-scratch build, only touched blocks change."""
    gen = torch.Generator().manual_seed(dim + bs)
    batch, kv_heads, capacity = 3, 2, 90
    nb = num_blocks(capacity, bs)
    keys = _keys(batch, kv_heads, capacity, dim, dtype, seed=3)
    pad = _pos([0, 5, 13])
    length = _pos([9, 20, 30])
    mean_key = build_block_summaries(keys, pad, length, bs)
    q_prev = None
    for q_len in [1, 5, 3, 9, 4, 12, 2, 7, 1, 6]:
        if q_prev is None:
            start = length.clone()
        else:  # accept 1 .. q_prev of the previous step's tokens: the rest are rolled back and overwritten
            accepted = torch.randint(1, q_prev + 1, (batch,), generator=gen).to(DEVICE)
            start = start + accepted
        rows = torch.arange(batch, device=DEVICE)[:, None]
        slots = start[:, None] + torch.arange(q_len, device=DEVICE)
        keys[rows, :, slots] = torch.randn(batch, q_len, kv_heads, dim, generator=gen).to(DEVICE, dtype)
        length = start + q_len
        for b in range(batch):  # stale drafts past the new tokens, to be ignored (and overwritten later)
            keys[b, :, int(length[b]) :] += 3.0

        touched = torch.zeros(batch, nb, dtype=torch.bool)
        for b in range(batch):
            touched[b, int(start[b]) // bs : (int(length[b]) - 1) // bs + 1] = True
        poison = mean_key.clone()
        poison[touched.to(DEVICE)[:, None].expand(-1, kv_heads, -1)] = float("nan")
        untouched_before = poison.clone()

        update_block_summaries(keys, poison, pad, start.int(), q_len, bs)
        expected = naive_build_block_summaries(keys, pad, length, bs)
        for b in range(batch):
            live = (int(length[b]) - 1) // bs + 1  # blocks past the last new token may hold stale drafts
            _close(poison[b, :, :live], expected[b, :, :live], dtype)
            still = ~touched[b]
            torch.testing.assert_close(
                poison[b][:, still.to(DEVICE)], untouched_before[b][:, still.to(DEVICE)]
            )
        ref = mean_key.double()
        naive_update_block_summaries(keys, ref, pad, start, q_len, bs)
        _close(poison, ref, dtype)
        mean_key, q_prev = poison, q_len
    assert int(length.max()) <= capacity


def test_update_grid_depends_on_q_len_only():
    assert [max_touched_blocks(q, 8) for q in (1, 2, 8, 9, 10, 17)] == [1, 2, 2, 2, 3, 3]


# ------------------------------------------------------------------------------------------ scoring


@pytest.mark.parametrize(
    "heads,kv_heads,dim,nb,dtype",
    [
        (4, 4, 16, 13, torch.float32),
        (8, 4, 32, 5, torch.bfloat16),
        (8, 2, 48, 40, torch.float16),
        (4, 1, 64, 129, torch.float32),
    ],
)
def test_score_matches_naive(heads, kv_heads, dim, nb, dtype):
    gen = torch.Generator().manual_seed(nb)
    bs, batch = 8, 3
    # the first draft token's query out of transformers' [B, H, q, D] layout: a non-contiguous view
    query = torch.randn(batch, 3, heads, dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)[:, :, 0]
    mean_key = torch.randn(batch, kv_heads, nb, dim, generator=gen).to(DEVICE)
    pad = _pos([0, 9, 3 * bs])
    length = _pos([nb * bs, nb * bs - 11, 3 * bs + 1])
    expected = naive_score_blocks(query, mean_key, pad, length, bs, 0.125)
    got = score_blocks(query, mean_key, pad, length, bs, scale=0.125)
    assert got.dtype == torch.float32 and got.shape == (batch, kv_heads, nb)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    _close(got.masked_fill(got.isinf(), 0), expected.masked_fill(expected.isinf(), 0), dtype)

    from hf_sparse_verify.kernels.block_summary.kernel import launch_score

    out = torch.full((1, batch, kv_heads, nb), float("nan"), device=DEVICE)
    launch_score(query[None], mean_key[None], pad, length, bs, 0.125, out)
    torch.testing.assert_close(out[0], got)


def test_score_batched_over_layers_equals_per_layer():
    gen = torch.Generator().manual_seed(5)
    layers, batch, heads, kv_heads, nb, dim, bs = 3, 2, 8, 2, 11, 32, 16
    query = torch.randn(layers, batch, heads, dim, generator=gen).to(DEVICE, torch.bfloat16)
    mean_key = torch.randn(layers, batch, kv_heads, nb, dim, generator=gen).to(DEVICE)
    pad, length = _pos([0, 20]), _pos([nb * bs, 100])
    batched = score_blocks(query, mean_key, pad, length, bs, scale=0.5)
    assert batched.shape == (layers, batch, kv_heads, nb)
    per_layer = torch.stack(
        [score_blocks(query[i], mean_key[i], pad, length, bs, 0.5) for i in range(layers)]
    )
    assert torch.equal(batched, per_layer)
    expected = naive_score_blocks(query, mean_key, pad, length, bs, 0.5)
    _close(batched.masked_fill(batched.isinf(), 0), expected.masked_fill(expected.isinf(), 0), torch.bfloat16)


# ---------------------------------------------------------------------------------------- selection


def _check_selection(scores, index, count, n, start, pad, q_len, bs):
    batch, kv_heads, nb = scores.shape
    for b in range(batch):
        forced = {int(pad[b]) // bs} | set(range(int(start[b]) // bs, (int(start[b]) + q_len - 1) // bs + 1))
        for h in range(kv_heads):
            c = int(count[b, h])
            chosen = index[b, h, :c].tolist()
            assert chosen == sorted(set(chosen)), "ascending, no duplicates"
            assert forced <= set(chosen), "sink and new-token blocks always present"
            assert (index[b, h, c:] == index[b, h, c - 1]).all(), "padding repeats the last entry"
            s = scores[b, h]
            valid_others = [j for j in range(nb) if j not in forced and s[j] != float("-inf")]
            picked = [j for j in chosen if j not in forced]
            assert c == len(forced) + min(n, len(valid_others))
            rest = [j for j in valid_others if j not in picked]
            if picked and rest:
                assert min(s[j] for j in picked) >= max(s[j] for j in rest), "top-n really the highest"


@pytest.mark.parametrize("n,q_len,bs", [(3, 5, 4), (0, 1, 8), (50, 9, 4), (2, 8, 8)])
def test_select_invariants(n, q_len, bs):
    gen = torch.Generator().manual_seed(n + q_len)
    batch, heads, kv_heads, dim, capacity = 3, 4, 2, 16, 64
    nb = num_blocks(capacity, bs)
    pad = _pos([0, 6, 17])
    start = _pos([capacity - q_len, 30, 17 + 3])
    length = start + q_len
    query = torch.randn(batch, heads, dim, generator=gen).to(DEVICE)
    mean_key = torch.randn(batch, kv_heads, nb, dim, generator=gen).to(DEVICE)
    scores = naive_score_blocks(query, mean_key, pad, length, bs, 1.0).float()
    index, count = select_top_blocks(scores, n, start.int(), pad, q_len, bs)
    assert index.dtype == torch.int32 and count.dtype == torch.int32
    assert index.shape == (batch, kv_heads, min(nb, n + 1 + max_touched_blocks(q_len, bs)))
    _check_selection(scores.cpu(), index.cpu(), count.cpu(), n, start, pad, q_len, bs)
    want = naive_select_top_blocks(scores.cpu(), n, start, pad, q_len, bs)
    got = [[index[b, h, : int(count[b, h])].tolist() for h in range(kv_heads)] for b in range(batch)]
    assert got == want


def test_select_batched_over_layers():
    gen = torch.Generator().manual_seed(9)
    scores = torch.randn(4, 2, 3, 10, generator=gen).to(DEVICE)  # [Lyr, B, H_kv, n]
    scores[:, 1, :, 7:] = float("-inf")
    start, pad = _pos([30, 20]), _pos([0, 4])
    index, count = select_top_blocks(scores, 2, start, pad, q_len=3, block_size=4)
    for i in range(4):
        one_index, one_count = select_top_blocks(scores[i], 2, start, pad, q_len=3, block_size=4)
        assert torch.equal(index[i], one_index) and torch.equal(count[i], one_count)


# ------------------------------------------------------------------------------ custom ops, errors


def test_custom_ops():
    keys = _keys(2, 2, 19, 16, torch.float32)
    pad, length = _pos([0, 3]), _pos([19, 12])
    mean_key = torch.ops.hsv.block_summary_build(keys, pad, length, 4)
    torch.testing.assert_close(mean_key.double(), naive_build_block_summaries(keys, pad, length, 4))
    query = torch.randn(2, 4, 16, device=DEVICE)
    scores = torch.ops.hsv.block_summary_score(query, mean_key, pad, length, 4, 0.25)
    expected = naive_score_blocks(query, mean_key, pad, length, 4, 0.25).float()
    torch.testing.assert_close(scores, expected)
    torch.library.opcheck(torch.ops.hsv.block_summary_build.default, (keys, pad, length, 4))
    torch.library.opcheck(torch.ops.hsv.block_summary_score.default, (query, mean_key, pad, length, 4, 0.25))
    start = _pos([15, 9])
    torch.library.opcheck(
        torch.ops.hsv.block_summary_update.default, (keys, mean_key.clone(), pad, start, 3, 4)
    )


def test_bad_input_errors():
    keys = _keys(2, 2, 16, 8, torch.float32)
    pad, length = _pos([0, 1]), _pos([16, 10])
    mean_key = build_block_summaries(keys, pad, length, 4)
    query = torch.randn(2, 4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="power of two"):
        build_block_summaries(keys, pad, length, 6)
    with pytest.raises(ValueError, match=r"keys must be \[B, H_kv, C, D\]"):
        build_block_summaries(keys[0], pad, length, 4)
    with pytest.raises(ValueError, match=r"pad must have shape \[B\]"):
        build_block_summaries(keys, pad[:1], length, 4)
    with pytest.raises(ValueError, match="length must be int32 or int64"):
        build_block_summaries(keys, pad, length.float(), 4)
    with pytest.raises(ValueError, match="mean_key must be float32"):
        update_block_summaries(keys, mean_key.half(), pad, length, 1, 4)
    with pytest.raises(ValueError, match=r"mean_key must be \[B, H_kv, ceil\(C / block_size\), D\]"):
        update_block_summaries(keys, mean_key[:, :, :2], pad, length, 1, 4)
    with pytest.raises(ValueError, match="q_len must be >= 1"):
        update_block_summaries(keys, mean_key, pad, length, 0, 4)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        score_blocks(query[:, :3], mean_key, pad, length, 4)
    with pytest.raises(ValueError, match="disagree"):
        score_blocks(query[:, :, :4], mean_key, pad, length, 4)
    with pytest.raises(ValueError, match="leading layer dimension"):
        score_blocks(query[None], mean_key, pad, length, 4)
    with pytest.raises(ValueError, match="n >= 0"):
        select_top_blocks(torch.zeros(2, 2, 4, device=DEVICE), -1, length, pad, 1, 4)


# ---------------------------------------------------------------------------------------- real size


@pytest.mark.skipif(not torch.cuda.is_available(), reason="real-size check needs CUDA")
def test_real_size_cuda():
    batch, kv_heads, heads, dim, capacity, bs = 1, 8, 32, 128, 65536, 64
    keys = torch.randn(batch, kv_heads, capacity, dim, device="cuda", dtype=torch.bfloat16)
    pad, length = _pos([100]), _pos([capacity - 200])
    mean_key = build_block_summaries(keys, pad, length, bs)
    dense = naive_build_block_summaries(keys[:, :, : 4 * bs], pad, length, bs)
    torch.testing.assert_close(mean_key[:, :, :4].double(), dense, rtol=1e-3, atol=1e-3)
    start = length.clone()
    keys[:, :, capacity - 200 : capacity - 192] = torch.randn(
        batch, kv_heads, 8, dim, device="cuda"
    ).bfloat16()
    update_block_summaries(keys, mean_key, pad, start, 8, bs)
    whole = keys.float().view(batch, kv_heads, -1, bs, dim)
    j = (capacity - 200) // bs
    torch.testing.assert_close(mean_key[0, :, j], whole[0, :, j, : (capacity - 192) - j * bs].mean(1))
    query = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
    scores = score_blocks(query, mean_key, pad, start + 8, bs, dim**-0.5)
    expected = naive_score_blocks(query, mean_key, pad, start + 8, bs, dim**-0.5)
    torch.testing.assert_close(
        scores.masked_fill(scores.isinf(), 0).double(),
        expected.masked_fill(expected.isinf(), 0),
        rtol=1e-3,
        atol=1e-3,
    )
