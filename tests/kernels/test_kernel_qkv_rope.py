"""qkv_proj and rope_qk kernels against their references (Triton interpreter on CPU), the references against
transformers' own arithmetic, and bad input."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.qkv_rope import (
    MAX_ROWS,
    qkv_proj,
    qkv_proj_naive,
    rope_qk,
    rope_qk_cache,
    rope_qk_naive,
    row_linear,
)
from hf_sparse_verify.kernels.qkv_rope import kernel as qkv_kernel

#: compiled kernels on a CUDA GPU, else the interpreter on CPU (TRITON_INTERPRET=1)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_runs_on(DEVICE), reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1"
)
# float32: summation order only; 16-bit: one rounding step (the CPU interpreter truncates where the GPU rounds)
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _poison(monkeypatch):
    def empty(shape, device, dtype):
        return torch.full(shape, float("nan"), device=device, dtype=dtype)

    monkeypatch.setattr(qkv_kernel, "_empty", empty)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows, hidden, n_q, n_kv, bias",
    [(1, 64, 128, 64, False), (3, 100, 48, 16, True), (MAX_ROWS, 40, 64, 32, False), (7, 256, 80, 80, True)],
)
def test_qkv_proj_matches_reference(monkeypatch, dtype, rows, hidden, n_q, n_kv, bias):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(rows * hidden + n_q)
    x = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    weights = [
        (torch.randn(n, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype) for n in (n_q, n_kv, n_kv)
    ]
    biases = (
        [torch.randn(n, generator=g).to(DEVICE, dtype) for n in (n_q, n_kv, n_kv)] if bias else [None] * 3
    )
    out = qkv_proj(x, *weights, *biases)
    ref = qkv_proj_naive(x, *weights, *biases)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == dtype and o.is_contiguous()
        torch.testing.assert_close(o.float(), r.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows, hidden, n_out, bias", [(1, 64, 48, False), (5, 100, 32, True), (MAX_ROWS, 256, 64, False)]
)
def test_row_linear_matches_reference(monkeypatch, dtype, rows, hidden, n_out, bias):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(rows + hidden)
    x = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n_out, hidden, generator=g) / hidden**0.5).to(DEVICE, dtype)
    b = torch.randn(n_out, generator=g).to(DEVICE, dtype) if bias else None
    out = row_linear(x, w, b)
    assert out.shape == (rows, n_out) and out.dtype == dtype
    torch.testing.assert_close(
        out.float(), torch.nn.functional.linear(x, w, b).float(), rtol=TOL[dtype], atol=TOL[dtype]
    )


def test_qkv_proj_strided_input():
    x = torch.randn(4, 64, 2, device=DEVICE)[:, :, 0]
    w = [torch.randn(n, 64, device=DEVICE) for n in (32, 16, 16)]
    for o, r in zip(qkv_proj(x, *w), qkv_proj_naive(x, *w)):
        torch.testing.assert_close(o, r, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, heads_q, heads_kv, head_dim", [(1, 4, 2, 16), (5, 3, 1, 64), (9, 2, 2, 10)])
@pytest.mark.parametrize("norm", [False, True])
def test_rope_qk_matches_reference(monkeypatch, dtype, rows, heads_q, heads_kv, head_dim, norm):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(rows + 7 * head_dim + norm)
    q = torch.randn(rows, heads_q * head_dim, generator=g).to(DEVICE, dtype)
    k = torch.randn(rows, heads_kv * head_dim, generator=g).to(DEVICE, dtype)
    angle = torch.rand(rows, head_dim // 2, generator=g) * 6
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(DEVICE, dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(DEVICE, dtype)
    weights = [
        (torch.rand(head_dim, generator=g) + 0.5).to(DEVICE, dtype) if norm else None for _ in range(2)
    ]
    out = rope_qk(q, k, cos, sin, head_dim, *weights, eps=1e-6)
    ref = rope_qk_naive(q, k, cos, sin, head_dim, *weights, eps=1e-6)
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == dtype and o.is_contiguous()
        torch.testing.assert_close(o.float(), r.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch, q_len, heads_kv, head_dim, norm", [(1, 1, 2, 16, True), (3, 4, 1, 10, False)]
)
def test_rope_qk_cache_equals_rope_then_cache_write(
    monkeypatch, dtype, batch, q_len, heads_kv, head_dim, norm
):
    """Keys and values written into the caches by the rotary launch are exactly what `rope_qk` + `cache_write` put
    there (same kernel arithmetic), the queries are `rope_qk`'s, and every other cache slot is untouched."""
    from hf_sparse_verify.kernels.cache_write import cache_write

    _poison(monkeypatch)
    g = torch.Generator().manual_seed(batch * 10 + q_len)
    rows, heads_q, capacity = batch * q_len, 2 * heads_kv, 12
    q = torch.randn(rows, heads_q * head_dim, generator=g).to(DEVICE, dtype)
    k, v = (torch.randn(rows, heads_kv * head_dim, generator=g).to(DEVICE, dtype) for _ in range(2))
    angle = torch.rand(rows, head_dim // 2, generator=g) * 6
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(DEVICE, dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(DEVICE, dtype)
    weights = [
        (torch.rand(head_dim, generator=g) + 0.5).to(DEVICE, dtype) if norm else None for _ in range(2)
    ]
    slots = torch.stack([torch.randperm(capacity, generator=g)[:q_len] for _ in range(batch)]).to(DEVICE)
    caches = [
        torch.randn(batch, heads_kv, capacity, head_dim, generator=g).to(DEVICE, dtype) for _ in range(2)
    ]
    expected = [c.clone() for c in caches]
    rq, rk = rope_qk(q, k, cos, sin, head_dim, *weights, eps=1e-6)
    new_k = rk.view(batch, q_len, heads_kv, head_dim).transpose(1, 2)
    new_v = v.view(batch, q_len, heads_kv, head_dim).transpose(1, 2)
    cache_write(*expected, new_k, new_v, slots)
    out_q = rope_qk_cache(q, k, v, cos, sin, head_dim, *weights, 1e-6, *caches, slots)
    assert torch.equal(out_q, rq)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])
    with pytest.raises(ValueError, match="slots"):
        rope_qk_cache(q, k, v, cos, sin, head_dim, *weights, 1e-6, *caches, slots[:, :1].float())
    with pytest.raises(ValueError, match="caches"):
        rope_qk_cache(q, k, v, cos, sin, head_dim, *weights, 1e-6, caches[0], caches[1][:, :, :4], slots)


def test_rope_reference_is_transformers_arithmetic():
    """The reference equals Qwen3's per-head RMSNorm followed by transformers' apply_rotary_pos_emb, bit for bit."""
    g = torch.Generator().manual_seed(3)
    rows, hq, hkv, d = 4, 4, 2, 16
    q = torch.randn(rows, hq * d, generator=g).bfloat16()
    k = torch.randn(rows, hkv * d, generator=g).bfloat16()
    cos, sin = torch.randn(rows, d, generator=g).bfloat16(), torch.randn(rows, d, generator=g).bfloat16()
    q_norm, k_norm = Qwen3RMSNorm(d, eps=1e-6).bfloat16(), Qwen3RMSNorm(d, eps=1e-6).bfloat16()
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
        # transformers' layout: [B=1, H, T, D], cos [B=1, T, D]
        eq, ek = apply_rotary_pos_emb(
            q_norm(q.view(rows, hq, d)).transpose(0, 1)[None], k_norm(k.view(rows, hkv, d)).transpose(0, 1)[None],
            cos[None], sin[None],
        )  # fmt: skip
        rq, rk = rope_qk_naive(q, k, cos, sin, d, q_norm.weight, k_norm.weight, 1e-6)
    assert torch.equal(rq, eq[0].transpose(0, 1)) and torch.equal(rk, ek[0].transpose(0, 1))


def test_bad_input():
    x, w = torch.randn(2, 32), torch.randn(32, 32)
    with pytest.raises(ValueError, match="at most"):
        qkv_proj(torch.randn(MAX_ROWS + 1, 32), w, w, w)
    with pytest.raises(ValueError, match="multiples of 16"):
        qkv_proj(x, torch.randn(24, 32), w, w)
    with pytest.raises(ValueError, match="all three"):
        qkv_proj(x, w, w, w, torch.zeros(32), None, None)
    with pytest.raises(ValueError, match="dtype"):
        qkv_proj(x, w.double(), w, w)
    with pytest.raises(ValueError, match="at most"):
        row_linear(torch.randn(MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="multiple of 16"):
        row_linear(x, torch.randn(24, 32))
    with pytest.raises(ValueError, match="even head_dim"):
        rope_qk(x, x, x, x, 5)
    with pytest.raises(ValueError, match="partial rotary"):
        rope_qk(x, x, torch.randn(2, 8), torch.randn(2, 8), 16)


def test_bench_entries_run():
    from hf_sparse_verify.kernels.bench_registry import load_all

    registry = load_all()
    for name in ("qkv_proj", "row_linear", "rope_qk"):
        cases = list(registry[name](DEVICE, torch.float32, True))
        assert {c.variant for c in cases} == {"triton", "torch"}
        for case in cases[:2]:
            case.run()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_on_views_of_one_projection_output(monkeypatch, dtype):
    """q / k / v as column views of one ``[T, q + k + v]`` output (a stacked low-bit copy's, split without a copy):
    the rotary launches read them by their row stride and give exactly what they give for contiguous inputs."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(7)
    batch, q_len, heads_q, heads_kv, head_dim, capacity = 2, 3, 4, 2, 16, 8
    rows = batch * q_len
    qkv = torch.randn(rows, (heads_q + 2 * heads_kv) * head_dim, generator=g).to(DEVICE, dtype)
    q, k, v = qkv.split([heads_q * head_dim, heads_kv * head_dim, heads_kv * head_dim], dim=-1)
    assert not q.is_contiguous() and q.stride(-1) == 1
    angle = torch.rand(rows, head_dim // 2, generator=g) * 6
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(DEVICE, dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(DEVICE, dtype)
    norms = [(torch.rand(head_dim, generator=g) + 0.5).to(DEVICE, dtype) for _ in range(2)]
    dense = [t.contiguous() for t in (q, k, v)]
    for got, want in zip(
        rope_qk(q, k, cos, sin, head_dim, *norms, eps=1e-6),
        rope_qk(*dense[:2], cos, sin, head_dim, *norms, eps=1e-6),
    ):
        assert torch.equal(got, want)
    slots = torch.stack([torch.randperm(capacity, generator=g)[:q_len] for _ in range(batch)]).to(DEVICE)
    caches = [torch.zeros(batch, heads_kv, capacity, head_dim, device=DEVICE, dtype=dtype) for _ in range(4)]
    got_q = rope_qk_cache(q, k, v, cos, sin, head_dim, *norms, 1e-6, caches[0], caches[1], slots)
    want_q = rope_qk_cache(*dense, cos, sin, head_dim, *norms, 1e-6, caches[2], caches[3], slots)
    assert (
        torch.equal(got_q, want_q) and torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    )
