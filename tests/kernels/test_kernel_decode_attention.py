"""Decode attention kernel vs its reference, and the reference vs a brute-force loop (CPU: Triton interpreter)."""

from __future__ import annotations

import pytest
import torch

from hf_sparse_verify.kernels.decode_attention import decode_attention, decode_attention_naive
from hf_sparse_verify.kernels.decode_attention.op import default_splits

TOL = {torch.float32: 2e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def _inputs(batch, heads, kv_heads, q_len, dim, capacity, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    # a strided query, as transformers passes it ([B, q, H, D] transposed)
    query = torch.randn(batch, q_len, heads, dim, generator=g).transpose(1, 2).to(device, dtype)
    key = torch.randn(batch, kv_heads, capacity, dim, generator=g).to(device, dtype)
    value = torch.randn(batch, kv_heads, capacity, dim, generator=g).to(device, dtype)
    # ragged rows: different left padding and lengths, all inside the capacity
    pad = torch.randint(0, 6, (batch,), generator=g)
    length = torch.randint(q_len + 8, capacity - 2, (batch,), generator=g)
    start = torch.maximum(length - q_len, pad)
    return query, key, value, start.to(device), pad.to(device)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _check(
    batch,
    heads,
    kv_heads,
    q_len,
    dim,
    capacity,
    dtype,
    window=0,
    collect=None,
    splits=None,
    seed=0,
    **score_kind,
):
    query, key, value, start, pad = _inputs(batch, heads, kv_heads, q_len, dim, capacity, dtype, seed=seed)
    scale = dim**-0.5
    out, scores = decode_attention(
        query, key, value, start, pad, scale, window=window, collect=collect, num_splits=splits, **score_kind
    )
    ref, ref_scores = decode_attention_naive(
        query.double(), key.double(), value.double(), start, pad, scale, window, collect, **score_kind
    )
    assert not out.isnan().any()
    assert out.dtype == dtype and out.shape == (batch, q_len, heads, dim)
    assert _rel(out, ref) < TOL[dtype]
    if collect:
        assert _rel(scores, ref_scores) < TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len", [1, 3, 16])
def test_matches_reference(dtype, q_len):
    _check(3, 8, 2, q_len, 32, 101, dtype, splits=3)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_gqa_groups(group):
    _check(2, 2 * group, 2, 5, 16, 77, torch.float32, splits=2, seed=group)


@pytest.mark.parametrize("splits", [1, 2, 7])
def test_split_counts_agree(splits):
    # more splits than tiles: some programs get no slots and must not disturb the merge
    _check(2, 4, 2, 4, 16, 150, torch.float32, splits=splits, seed=3)


def test_odd_head_dim_and_window():
    _check(2, 6, 3, 4, 24, 90, torch.float32, window=9, splits=2, seed=4)


@pytest.mark.parametrize("collect", ["two_rows", "all_rows"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_score_collection(collect, q_len):
    # q_len 1: the logits tile's rows are reduced; 5 (20 rows): the extra 16-row dot with the summed queries
    _check(3, 8, 2, q_len, 16, 83, torch.float32, collect=collect, splits=3, seed=5)


@pytest.mark.parametrize("collect", ["two_rows", "all_rows"])
@pytest.mark.parametrize("q_len", [1, 6])
@pytest.mark.parametrize("per_kv_head", [False, True])
def test_weight_scores(collect, q_len, per_kv_head):
    """Softmax-weight scores (log-sum-exp from the merge, logits of the scored rows normalised after it)."""
    _check(3, 8, 2, q_len, 16, 83, torch.float32, collect=collect, splits=3, seed=7, weights=True,
           per_kv_head=per_kv_head)  # fmt: skip


@pytest.mark.parametrize("collect", ["two_rows", "all_rows"])
@pytest.mark.parametrize("q_len, window, softcap", [(1, 0, 0.0), (6, 0, 0.0), (7, 11, 4.0)])
@pytest.mark.parametrize("per_kv_head", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("carried_dot", [True, False])
def test_carried_lse_weights(monkeypatch, collect, q_len, window, softcap, per_kv_head, dtype, carried_dot):
    """Weights against a carried log-sum-exp, summed in the split kernel (a 16-row dot or a row reduction): the
    scores match the reference's, and both overwrite the carried tensor with the first row's log-sum-exp (in
    place)."""
    from hf_sparse_verify.kernels.decode_attention import kernel

    monkeypatch.setattr(kernel, "CARRIED_DOT", carried_dot)
    query, key, value, start, pad = _inputs(3, 8, 2, q_len, 16, 83, dtype, seed=21 + q_len)
    scale = 16**-0.5
    carried = torch.linspace(-1.0, 3.0, 3 * 8).view(3, 8).contiguous()
    kind = dict(window=window, collect=collect, weights=True, per_kv_head=per_kv_head, softcap=softcap)
    mine, theirs = carried.clone(), carried.clone()
    out, scores = decode_attention(
        query, key, value, start, pad, scale, num_splits=3, carried_lse=mine, **kind
    )
    ref, ref_scores = decode_attention_naive(
        query.double(), key.double(), value.double(), start, pad, scale, carried_lse=theirs, **kind
    )
    assert _rel(out, ref) < TOL[dtype]
    assert scores.shape == ref_scores.shape and _rel(scores, ref_scores) < TOL[dtype]
    assert not torch.equal(mine, carried) and torch.allclose(mine, theirs, atol=TOL[dtype] * 10)
    first = decode_attention_naive(
        query.double()[:, :, :1], key.double(), value.double(), start, pad, scale, window, "all_rows",
        weights=True, softcap=softcap, carried_lse=theirs.clone(),
    )[1]  # fmt: skip
    # the first row alone normalised by its own log-sum-exp: per head its weights sum to 1, so the scores do too
    assert torch.allclose(first.sum(-1), torch.ones(3, dtype=first.dtype), atol=1e-3)


def test_carried_lse_rejects_bad_input():
    query, key, value, start, pad = _inputs(2, 4, 2, 3, 16, 40, torch.float32)
    with pytest.raises(ValueError, match="weights=True"):
        decode_attention(query, key, value, start, pad, 0.25, carried_lse=torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\[B, H\] = \[2, 4\]"):
        decode_attention(query, key, value, start, pad, 0.25, collect="two_rows", weights=True,
                         carried_lse=torch.zeros(2, 2))  # fmt: skip


@pytest.mark.parametrize("row_dot", [True, False])
@pytest.mark.parametrize(
    "group, q_len, dtype", [(4, 6, torch.float32), (8, 3, torch.float32), (4, 9, torch.bfloat16)]
)
def test_weight_scores_row_dot(monkeypatch, row_dot, group, q_len, dtype):
    """More than 16 query rows: the first and last rows' logits from their own 16-row dot (``group x 2 <= 16``)
    or stored from the step's logits tile; both match the reference (8 x 2 = 16 fills the small tile)."""
    from hf_sparse_verify.kernels.decode_attention import kernel

    monkeypatch.setattr(kernel, "WEIGHT_ROW_DOT", row_dot)
    _check(2, 2 * group, 2, q_len, 16, 75, dtype, window=11 if dtype != torch.float32 else 0,
           collect="two_rows", splits=3, seed=group + q_len, weights=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_len", [1, 6])
@pytest.mark.parametrize("softcap, with_sinks", [(5.0, False), (0.0, True), (3.0, True)])
def test_soft_cap_and_sinks(dtype, q_len, softcap, with_sinks):
    """Logit soft-capping (Gemma 2, Cohere 2) and per-head sink logits (GPT-OSS), also with softmax-weight scores
    of first and last rows (through the 16-row scored-query dot at 6 new tokens x 4 heads per KV head)."""
    sinks = torch.linspace(-1.0, 2.0, 8) if with_sinks else None
    _check(2, 8, 2, q_len, 16, 70, dtype, window=13 if dtype == torch.bfloat16 else 0, collect="two_rows",
           splits=3, seed=11, weights=True, softcap=softcap, sinks=sinks)  # fmt: skip


def test_soft_cap_and_sinks_reference_against_the_definition():
    """The reference's capped logits and sink denominators, written out for one row and head."""
    query, key, value, start, pad = _inputs(1, 2, 1, 2, 8, 20, torch.float64, seed=12)
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    out, _ = decode_attention_naive(query, key, value, start, pad, 0.3, softcap=2.0, sinks=sinks)
    for head in range(2):
        for i in range(2):
            own = int(start[0]) + i
            slots = range(int(pad[0]), own + 1)
            logits = torch.stack([(query[0, head, i] @ key[0, 0, j]) * 0.3 for j in slots])
            logits = 2.0 * torch.tanh(logits / 2.0)
            weights = torch.exp(logits) / (torch.exp(logits).sum() + torch.exp(sinks[head]))
            want = sum(w * value[0, 0, j] for w, j in zip(weights, slots))
            torch.testing.assert_close(out[0, i, head], want)


def test_weight_scores_window_and_bf16():
    _check(2, 6, 3, 4, 24, 90, torch.bfloat16, window=9, collect="two_rows", splits=2, seed=8, weights=True)


def test_weight_scores_sum_to_rows_mass():
    """Per row the weights over the attended slots sum to 1, so the head and row mean sums to 1 too."""
    query, key, value, start, pad = _inputs(2, 4, 2, 3, 16, 64, torch.float32, seed=9)
    _, scores = decode_attention(query, key, value, start, pad, 0.25, collect="two_rows", weights=True)
    torch.testing.assert_close(scores.sum(dim=1), torch.ones(2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_score_collection_16_bit_many_rows(dtype):
    _check(2, 8, 2, 16, 32, 70, dtype, collect="two_rows", splits=2, seed=6)


def test_reference_matches_brute_force():
    """The reference against an explicit loop over rows, heads and slots."""
    query, key, value, start, pad = _inputs(2, 4, 2, 3, 8, 40, torch.float64, seed=7)
    window, scale = 6, 0.3
    out, scores = decode_attention_naive(query, key, value, start, pad, scale, window, "two_rows")
    for b in range(2):
        for h in range(4):
            for i in range(3):
                own = int(start[b]) + i
                slots = [j for j in range(40) if (int(pad[b]) <= j <= own and j > own - window) or j == own]
                k, v = key[b, h // 2, slots], value[b, h // 2, slots]
                p = torch.softmax(k @ query[b, h, i] * scale, dim=0)
                torch.testing.assert_close(out[b, i, h], p @ v)
        lo, hi = max(int(pad[b]), int(start[b]) - window + 1), int(start[b]) + 3
        for j in range(40):
            expect = 0.0
            if lo <= j < hi:
                expect = (
                    sum(float(query[b, h, r] @ key[b, h // 2, j]) for h in range(4) for r in (0, 2))
                    * scale
                    / 8
                )
            assert abs(float(scores[b, j]) - expect) < 1e-6  # scores are float32


def test_padding_query_attends_own_slot():
    # a query inside the left padding (a prefill-like row) still gets a finite output
    query, key, value, _, _ = _inputs(1, 2, 1, 2, 16, 20, torch.float32, seed=8)
    start, pad = torch.tensor([3]), torch.tensor([5])
    out, _ = decode_attention(query, key, value, start, pad, 0.25, num_splits=1)
    ref, _ = decode_attention_naive(query.double(), key.double(), value.double(), start, pad, 0.25)
    assert _rel(out, ref) < 1e-4


def test_custom_op_registered():
    query, key, value, start, pad = _inputs(1, 4, 2, 2, 16, 30, torch.float32, seed=9)
    out, scores = torch.ops.hsv.decode_attention(
        query, key, value, start, pad, 0.25, 0, 1, 2, False, False, 0.0, None, None
    )
    assert out.shape == (1, 2, 4, 16) and scores.shape == (1, 30)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fq = torch.empty(1, 4, 2, 16)
        fk = torch.empty(1, 2, 30, 16)
        fo, fs = torch.ops.hsv.decode_attention(
            fq,
            fk,
            fk,
            torch.empty(1, dtype=torch.long),
            torch.empty(1, dtype=torch.long),
            0.25,
            0,
            0,
            2,
            False,
            False,
            0.0,
            None,
            None,
        )
        assert fo.shape == (1, 2, 4, 16) and fs.shape == (1, 0)


def test_default_splits_from_shapes():
    assert default_splits(1, 8, 1024) == 16
    assert default_splits(1, 8, 65536) == 33
    assert default_splits(32, 8, 16384) == 2
    assert default_splits(1, 8, 100) == 2
    assert default_splits(1, 8, 60) == 1


def test_default_splits_spread_programs_evenly_over_the_multiprocessors():
    # 4 x 64K, 8 KV heads: occupancy asks for 9 splits (288 programs: 3 on some of 132 SMs, 2 on others); 12 splits
    # (384 programs) load every SM with about 3
    assert default_splits(4, 8, 65536, sm_count=132) == 12
    # already even: the fewest splits stay (16 x 16K: 384 programs)
    assert default_splits(16, 8, 16384, sm_count=132) == 3
    # never below the occupancy count, never above twice it
    for batch, capacity in ((2, 8192), (3, 40000), (4, 65536), (8, 32768)):
        splits = default_splits(batch, 8, capacity, sm_count=132)
        low = -(-264 // (batch * 8))
        assert low <= splits <= 2 * low


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(query=a["query"][0]), "query must be"),
        (lambda a: a.update(value=a["value"][:, :, :-1]), "same shape"),
        (lambda a: a.update(query=torch.randn(1, 3, 2, 16)), "multiple of KV heads"),
        (lambda a: a.update(start=a["start"].float()), "start must be"),
        (lambda a: a.update(window=-1), "window must be"),
        (lambda a: a.update(collect="first"), "collect must be"),
        (lambda a: a.update(query=torch.randn(1, 4, 65, 16)), "rows per program"),
    ],
)
def test_bad_input(change, message):
    query, key, value, start, pad = _inputs(1, 4, 2, 2, 16, 30, torch.float32)
    args = dict(query=query, key=key, value=value, start=start, pad=pad, scale=0.25)
    change(args)
    with pytest.raises(ValueError, match=message):
        decode_attention(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("q_len", [1, 2, 8, 16])
@pytest.mark.parametrize("context", [1000, 33000])
def test_real_shapes_on_gpu(q_len, context):
    query, key, value, start, pad = _inputs(1, 32, 8, q_len, 128, context + 16, torch.bfloat16, "cuda")
    start = torch.tensor([context - q_len], device="cuda")
    pad = torch.zeros(1, dtype=torch.long, device="cuda")
    for weights in (False, True):
        out, scores = decode_attention(
            query, key, value, start, pad, 128**-0.5, collect="two_rows", weights=weights
        )
        ref, ref_scores = decode_attention_naive(
            query, key, value, start, pad, 128**-0.5, 0, "two_rows", weights=weights
        )
        assert _rel(out, ref) < 2e-2 and _rel(scores, ref_scores) < 2e-2
