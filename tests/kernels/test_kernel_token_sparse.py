"""Token-sparse attention: Triton kernel (CPU interpreter without a GPU) against the float64 reference."""

from __future__ import annotations

import doctest
import math

import pytest
import torch
import torch.nn.functional as F

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.token_sparse import (
    naive,
    op,
    token_sparse_attention,
    token_sparse_attention_naive,
)
from hf_sparse_verify.kernels.token_sparse.kernel import token_sparse_attention_triton

pytestmark = pytest.mark.skipif(not triton_runs_on(torch.device("cpu")) and not torch.cuda.is_available(),
                                reason="needs Triton (interpreter or CUDA)")  # fmt: skip

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def make_case(batch=3, heads=4, kv_heads=2, q_len=3, capacity=100, dim=32, width=20, dtype=torch.float32,
              index_dtype=torch.int32, seed=0):  # fmt: skip
    """Random inputs; rows differ in start, recent_start and count. Entries past the count hold junk slots."""
    gen = torch.Generator().manual_seed(seed)
    layouts = [  # (recent_start, start, count)
        (capacity // 2, capacity // 2 + 5, width),
        (capacity - q_len - 2, capacity - q_len, width // 2),
        (7, 7, 0),
    ]
    recent, start, count, rows = [], [], [], []
    for b in range(batch):
        r, s, c = layouts[b % len(layouts)]
        c = min(c, r)
        slots = torch.randperm(r, generator=gen)[:c].sort().values
        junk = torch.randint(-5, 3 * capacity, (width - c,), generator=gen)
        rows.append(torch.cat([slots, junk]))
        recent.append(r)
        start.append(s)
        count.append(c)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    return dict(
        query=rand(batch, heads, q_len, dim),
        key=rand(batch, kv_heads, capacity, dim),
        value=rand(batch, kv_heads, capacity, dim),
        index=torch.stack(rows).to(DEVICE, index_dtype),
        index_count=torch.tensor(count, dtype=torch.int32, device=DEVICE),
        recent_start=torch.tensor(recent, device=DEVICE),
        start=torch.tensor(start, device=DEVICE),
        scale=dim**-0.5,
    )


def reference64(a: dict) -> torch.Tensor:
    f = {k: (v.double() if k in ("query", "key", "value") else v) for k, v in a.items()}
    return token_sparse_attention_naive(**f)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not out.isnan().any(), "unwritten (NaN) outputs"
    tol = TOL[dtype]
    torch.testing.assert_close(out.double().cpu(), ref.cpu(), rtol=tol, atol=tol)


@pytest.fixture
def poison(monkeypatch):
    """Every floating ``torch.empty`` (output, partial results) starts as NaN, so unwritten entries fail."""
    real = torch.empty

    def empty(*args, **kwargs):
        t = real(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)


# ---- the reference itself ----


def brute_force(a: dict) -> torch.Tensor:
    """Per row, query and head: list the attended slots by hand, softmax over them in float64."""
    q, k, v = a["query"].double().cpu(), a["key"].double().cpu(), a["value"].double().cpu()
    batch, heads, q_len, dim = q.shape
    group = heads // k.shape[1]
    out = torch.zeros(batch, q_len, heads, dim, dtype=torch.float64)
    for b in range(batch):
        chosen = set(a["index"][b, : int(a["index_count"][b])].tolist())
        for i in range(q_len):
            last = int(a["start"][b]) + i
            slots = sorted(chosen | set(range(int(a["recent_start"][b]), last + 1)))
            if not slots:
                continue
            for h in range(heads):
                kk, vv = k[b, h // group, slots], v[b, h // group, slots]
                w = torch.softmax(kk @ q[b, h, i] * a["scale"], dim=0)
                out[b, i, h] = w @ vv
    return out


def test_naive_matches_brute_force():
    a = make_case(batch=3, heads=4, kv_heads=2, q_len=3, capacity=37, dim=16, width=9)
    torch.testing.assert_close(reference64(a).cpu(), brute_force(a), rtol=1e-12, atol=1e-12)


def test_naive_full_selection_is_dense_causal():
    """Selecting every prefix slot after the padding reproduces dense causal attention."""
    batch, heads, kv_heads, q_len, capacity, dim = 2, 4, 2, 3, 40, 16
    pad, recent, start = torch.tensor([0, 6]), torch.tensor([30, 25]), torch.tensor([33, 31])
    index = torch.stack([torch.cat([torch.arange(p, r), torch.zeros(30 - r + p, dtype=torch.long)])
                         for p, r in zip(pad.tolist(), recent.tolist())])  # fmt: skip
    count = recent - pad
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(batch, heads, q_len, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, capacity, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, capacity, dim, generator=gen, dtype=torch.float64)
    out = token_sparse_attention_naive(q, k, v, index, count, recent, start, 0.3)
    slots = torch.arange(capacity)
    causal = (slots[None, None] >= pad[:, None, None]) & (
        slots[None, None] <= start[:, None, None] + torch.arange(q_len)[None, :, None]
    )
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=causal[:, None], scale=0.3, enable_gqa=True)
    torch.testing.assert_close(out, dense.transpose(1, 2), rtol=1e-12, atol=1e-12)


def test_docstring_examples():
    for module in (naive, op):
        assert doctest.testmod(module).failed == 0


# ---- Triton kernel against the reference ----


@pytest.mark.parametrize("group", [1, 2, 4])
@pytest.mark.parametrize("q_len", [1, 3, 5])
def test_kernel_gqa_and_query_lengths(group, q_len, poison):
    a = make_case(heads=2 * group, kv_heads=2, q_len=q_len, seed=group * 10 + q_len)
    for splits in (1, 3):  # direct store, and partials + merge
        assert_close(token_sparse_attention_triton(**a, num_splits=splits), reference64(a), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [16, 64])
def test_kernel_dtypes_and_head_dims(dtype, dim, poison):
    a = make_case(dim=dim, capacity=37, width=11, dtype=dtype, index_dtype=torch.int64, seed=dim)
    assert_close(token_sparse_attention_triton(**a), reference64(a), dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 7])
def test_kernel_splits(num_splits, poison):
    """More splits than slots leaves some splits empty; their partials must not disturb the merge."""
    a = make_case(q_len=2, capacity=150, width=70, seed=num_splits)
    assert_close(token_sparse_attention_triton(**a, num_splits=num_splits), reference64(a), torch.float32)


def test_kernel_batch1_long_selection(poison):
    """Several BLOCK_N tiles per split; index as int64."""
    a = make_case(batch=1, heads=8, kv_heads=2, q_len=1, capacity=300, width=200, index_dtype=torch.int64)
    assert_close(token_sparse_attention_triton(**a, num_splits=2), reference64(a), torch.float32)


def test_kernel_rows_attending_nothing_are_zero(poison):
    a = make_case(batch=3)
    a["index_count"] = torch.tensor([0, 0, 4], dtype=torch.int32, device=DEVICE)
    a["index"][2, :4] = torch.tensor([1, 10, 20, 30])
    a["recent_start"] = torch.tensor([90, 99, 50], device=DEVICE)
    a["start"] = torch.tensor([10, 20, 5], device=DEVICE)  # recent part lies after every query
    for splits in (1, 3):
        out = token_sparse_attention_triton(**a, num_splits=splits)
        assert_close(out, reference64(a), torch.float32)
        assert (out[:2] == 0).all()


def test_kernel_empty_index_and_strided_inputs(poison):
    """N = 0 (recent slots only); query a transposed view, key/value views of a [B, C, H_kv, D] buffer."""
    a = make_case(width=0, capacity=50)
    a["query"] = a["query"].transpose(1, 2).contiguous().transpose(1, 2)
    a["key"] = a["key"].transpose(1, 2).contiguous().transpose(1, 2)
    a["value"] = a["value"].transpose(1, 2).contiguous().transpose(1, 2)
    assert not a["query"].is_contiguous() and not a["key"].is_contiguous()
    assert_close(token_sparse_attention_triton(**a), reference64(a), torch.float32)


# ---- the custom op ----


def test_custom_op_matches_reference():
    a = make_case(q_len=2, seed=5)
    out = torch.ops.hsv.token_sparse_attention(*a.values())
    assert_close(out, reference64(a), torch.float32)
    assert_close(token_sparse_attention(**a), reference64(a), torch.float32)


def test_opcheck():
    a = make_case(batch=2, q_len=1, capacity=40, dim=16, width=6, seed=7)
    torch.library.opcheck(torch.ops.hsv.token_sparse_attention.default, tuple(a.values()))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(query=a["query"][0]), "query must be"),
        (lambda a: a.update(value=a["value"][:, :, :-1]), "value"),
        (lambda a: a.update(query=a["query"][:, :3]), "multiple of KV heads"),
        (lambda a: a.update(key=a["key"].half()), "one dtype"),
        (lambda a: a.update(index=a["index"].float()), "index must be"),
        (lambda a: a.update(index_count=a["index_count"][:2]), "index_count must be"),
        (lambda a: a.update(start=a["start"].float()), "start must be"),
    ],
)
def test_bad_input(change, message):
    a = make_case()
    change(a)
    with pytest.raises(ValueError, match=message):
        token_sparse_attention(**a)


def test_bench_quick_cases_agree():
    """The benchmark's variants compute the same attention (the gather + SDPA one is the library's old path)."""
    import hf_sparse_verify.kernels.token_sparse.bench  # noqa: F401  (registers the entry)
    from hf_sparse_verify.kernels.bench_registry import BENCHMARKS

    cases = list(BENCHMARKS["token_sparse"](DEVICE, torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "gather_sdpa"}
    for triton_case, sdpa_case in zip(cases[::2], cases[1::2]):
        assert triton_case.params == sdpa_case.params and triton_case.bytes_moved > 0
        torch.testing.assert_close(triton_case.run(), sdpa_case.run(), rtol=1e-4, atol=1e-4)


# ---- real sizes (CUDA only) ----


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("q_len", [1, 4])
def test_real_size_cuda(q_len):
    from hf_sparse_verify.kernels.token_sparse.bench import _inputs, gather_sdpa

    context = 65536
    a = _inputs(torch.device("cuda"), torch.bfloat16, context, q_len, 32, 8, 128)
    out = token_sparse_attention(**a)
    ref = token_sparse_attention_naive(**a).float()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    valid = torch.ones_like(a["index"], dtype=torch.bool)
    sdpa = gather_sdpa(a["query"], a["key"], a["value"], a["index"].long(), valid, context - 16, context,
                       a["recent_start"], a["start"], a["scale"])  # fmt: skip
    torch.testing.assert_close(out.float(), sdpa.float(), rtol=2e-2, atol=2e-2)
    assert math.isfinite(out.float().abs().max().item())
