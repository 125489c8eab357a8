"""Fused experts: Triton (interpreted on CPU) vs the float64 reference on odd shapes, per-token expert counts,
the block layout (every active pair once, padding blocks empty, the worst-case block count), unselected experts
never read, poisoned buffers, the custom op and input checks."""

from __future__ import annotations

import doctest

import pytest
import torch

import hf_sparse_verify.kernels.fused_experts.op as op_module
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.fused_experts import active_pairs, fused_experts, fused_experts_naive
from hf_sparse_verify.kernels.fused_experts import kernel as kernel_module

needs_triton = pytest.mark.skipif(
    not triton_runs_on(torch.device("cpu")), reason="Triton interpreter not set"
)
#: float32: summation order only; bf16: the intermediate is rounded to bf16 before the down projection (and the
#: CPU interpreter truncates where the GPU rounds), relative to the output's scale
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def make_inputs(tokens, experts, top_k, hidden, inter, dtype=torch.float32, seed=0, skip=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5).to(dtype)
    w_down = (torch.randn(experts, hidden, inter, generator=g) / inter**0.5).to(dtype)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])  # [T, k]
    weights = torch.rand(tokens, top_k, generator=g).to(dtype)
    n_active = torch.randint(0, top_k + 1, (tokens,), generator=g) if skip else None
    return x, w_gate_up, w_down, index, weights, n_active


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the launch allocates starts as NaN (floats) or a huge id (ints), so a read of an unwritten
    element fails loudly (NaN in the output, or an out-of-bounds access)."""

    def empty(shape, device, dtype):
        fill = float("nan") if dtype.is_floating_point else 2**30
        return torch.full(shape, fill, device=device, dtype=dtype)

    monkeypatch.setattr(kernel_module, "_empty", empty)


def reference(x, w_gate_up, w_down, index, weights, n_active=None, transposed=False):
    return fused_experts_naive(
        x.double(), w_gate_up.double(), w_down.double(), index, weights.double(), n_active, transposed
    )


def check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape and torch.isfinite(out).all()
    scale = ref.abs().max().clamp_min(1.0)
    torch.testing.assert_close(out.double() / scale, ref / scale, rtol=0, atol=TOL[dtype])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens, experts, top_k, hidden, inter, skip",
    [
        (1, 4, 1, 32, 24, False),
        (1, 8, 4, 48, 64, True),
        (5, 4, 2, 48, 24, True),
        (5, 8, 1, 32, 64, False),
        (17, 8, 4, 32, 24, True),
        (17, 4, 2, 48, 64, False),
    ],
)
def test_matches_reference(poisoned, dtype, tokens, experts, top_k, hidden, inter, skip):
    inputs = make_inputs(
        tokens, experts, top_k, hidden, inter, dtype, seed=tokens * experts + top_k, skip=skip
    )
    out = kernel_module.launch(*inputs, transposed=False)
    check(out, reference(*inputs), dtype)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, skip", [(1, False), (5, True), (17, False)])
def test_residual_is_added_in_the_last_launch(poisoned, dtype, tokens, skip):
    """``residual=r`` gives ``r + fused_experts(...)`` (the sum rounded to the activation dtype first, as a decoder
    layer adds it) on each layout (one token, the expert grid, aligned blocks): bitwise in float32; in bf16 within
    one rounding step, as the CPU interpreter truncates where torch's add rounds (on the GPU both round). The
    reference is bitwise its own sum plus the residual."""
    inputs = make_inputs(tokens, 8, 4, 48, 24, dtype, seed=tokens + 11, skip=skip)
    residual = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens)).to(dtype) * 4
    out = kernel_module.launch(*inputs, transposed=False, residual=residual)
    expected = residual + kernel_module.launch(*inputs, transposed=False)
    if dtype == torch.float32:
        assert torch.equal(out, expected)
        assert torch.equal(fused_experts(*inputs, residual=residual), residual + fused_experts(*inputs))
    else:
        torch.testing.assert_close(out.float(), expected.float(), rtol=1.6e-2, atol=1.6e-2)
    assert not torch.equal(out, kernel_module.launch(*inputs, transposed=False))
    ref = fused_experts_naive(*inputs, residual=residual)
    assert torch.equal(ref, residual + fused_experts_naive(*inputs))
    with pytest.raises(ValueError, match="residual must match hidden"):
        fused_experts(*inputs, residual=residual[:, :40])


@needs_triton
def test_transposed_strided_and_out_of_range_ids(poisoned):
    """Transposed weights ([E, H, 2I] / [E, I, H]), a strided hidden input, ids outside [0, E) skipped."""
    x, w_gate_up, w_down, index, weights, n_active = make_inputs(9, 8, 4, 48, 24, seed=3, skip=True)
    index[2, 1], index[4, 0] = -1, 8
    x_strided = torch.stack([x, x], dim=-1)[..., 0]
    out = fused_experts(
        x_strided,
        w_gate_up.transpose(1, 2).contiguous(),
        w_down.transpose(1, 2).contiguous(),
        index,
        weights,
        n_active,
        transposed=True,
    )
    check(out, reference(x, w_gate_up, w_down, index, weights, n_active), torch.float32)


@needs_triton
def test_unselected_experts_are_never_read(poisoned):
    """NaN weights in every expert no active pair selects (including experts only dropped pairs select): the
    padding blocks exit before loading weights, and dropped pairs are never computed."""
    x, w_gate_up, w_down, index, weights, _ = make_inputs(5, 8, 2, 32, 24, seed=5)
    n_active = torch.tensor([2, 1, 0, 2, 1])
    used = index[active_pairs(index, 8, n_active)].unique()
    unused = torch.ones(8, dtype=torch.bool)
    unused[used] = False
    assert unused.any()
    w_gate_up[unused], w_down[unused] = float("nan"), float("nan")
    out = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    check(out, reference(x, w_gate_up, w_down, index, weights, n_active), torch.float32)
    assert torch.equal(out[2], torch.zeros(32))  # a token with no active expert gets zeros


@needs_triton
@pytest.mark.parametrize("block_m", [16, 32])
def test_block_layout(block_m):
    """Every active pair sits in exactly one slot of a block of its own expert, in token order; used blocks come
    first, with ceil(count / block_m) blocks per expert; the rest have 0 rows and expert -1."""
    experts, top_k = 8, 4
    g = torch.Generator().manual_seed(block_m)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(23)])
    n_active = torch.randint(0, top_k + 1, (23,), generator=g)
    slot_pair, block_expert, block_rows = kernel_module.align(index, n_active, experts, block_m)
    active = active_pairs(index, experts, n_active).flatten()
    flat = index.flatten()
    counts = torch.bincount(flat[active], minlength=experts)
    used = int((-(-counts // block_m)).sum())
    assert len(block_rows) == kernel_module.max_blocks(index.numel(), experts, block_m)
    assert (block_rows[used:] == 0).all() and (block_expert[used:] == -1).all()
    seen = []
    for b in range(used):
        rows, e = int(block_rows[b]), int(block_expert[b])
        assert 1 <= rows <= block_m
        pairs = slot_pair[b * block_m : b * block_m + rows].long()
        assert (flat[pairs] == e).all() and active[pairs].all()
        seen.extend(pairs.tolist())
    assert sorted(seen) == torch.nonzero(active).flatten().tolist()
    for e in range(experts):  # token order within each expert
        mine = [p for p in seen if flat[p] == e]
        assert mine == sorted(mine)


@pytest.mark.parametrize("pairs, experts, block_m", [(8, 128, 16), (64, 128, 16), (68, 8, 16), (300, 8, 32)])
def test_max_blocks_is_reached_and_never_exceeded(pairs, experts, block_m):
    """The bound is tight (one pair in each of the most experts possible, the rest on one expert) and random
    routings never use more."""
    bound = kernel_module.max_blocks(pairs, experts, block_m)
    nonzero = min(experts, pairs)
    counts = [1] * nonzero
    counts[0] += pairs - nonzero
    assert sum(-(-c // block_m) for c in counts) == bound
    g = torch.Generator().manual_seed(pairs)
    for _ in range(20):
        routed = torch.randint(0, experts, (pairs,), generator=g)
        assert int((-(-torch.bincount(routed, minlength=experts) // block_m)).sum()) <= bound


@needs_triton
def test_deterministic_and_empty_input():
    inputs = make_inputs(17, 8, 2, 32, 24, seed=7)
    first = kernel_module.launch(*inputs, transposed=False)
    assert torch.equal(first, kernel_module.launch(*inputs, transposed=False))
    x, w_gate_up, w_down, index, weights, _ = inputs
    empty = fused_experts(x[:0], w_gate_up, w_down, index[:0], weights[:0])
    assert empty.shape == (0, 32)


def test_float64_falls_back_to_reference_and_op_checks():
    inputs = make_inputs(5, 4, 2, 32, 24, torch.float64, seed=1, skip=True)
    out = fused_experts(*inputs)
    assert torch.equal(out, fused_experts_naive(*inputs))
    torch.library.opcheck(torch.ops.hsv.fused_experts.default, (*inputs, False, None))
    residual = torch.randn(5, 32, dtype=torch.float64)
    torch.library.opcheck(torch.ops.hsv.fused_experts.default, (*inputs, False, residual))
    assert doctest.testmod(op_module, extraglobs={"torch": torch}).failed == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "w_down": a["w_down"][:, :, :8]}, "do not match hidden size"),
        (lambda a: {**a, "top_k_index": a["top_k_index"].float()}, "top_k_index must be"),
        (lambda a: {**a, "top_k_weights": a["top_k_weights"][:, :1]}, "top_k_weights must be"),
        (lambda a: {**a, "n_active": torch.ones(4, dtype=torch.long)}, "n_active must be"),
        (lambda a: {**a, "w_gate_up": a["w_gate_up"].double()}, "share one float dtype"),
        (lambda a: {**a, "hidden": a["hidden"][None]}, "needs hidden"),
    ],
)
def test_bad_input(change, message):
    x, w_gate_up, w_down, index, weights, _ = make_inputs(5, 4, 2, 32, 24)
    args = dict(hidden=x, w_gate_up=w_gate_up, w_down=w_down, top_k_index=index, top_k_weights=weights)
    with pytest.raises(ValueError, match=message):
        fused_experts(**change(args))


@needs_triton
def test_benchmark_entry_runs():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["fused_experts"](torch.device("cpu"), torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "batched_mm", "grouped_mm"}
    first = cases[0]
    assert first.variant == "triton" and first.bytes_moved > 0
    expected = next(c for c in cases if c.variant == "batched_mm" and c.params == first.params).run()
    torch.testing.assert_close(first.run(), expected, rtol=1e-5, atol=1e-5)


class _Refuse:
    """Stands in for a kernel the one-token path must not launch."""

    def __getitem__(self, grid):
        raise AssertionError("the one-token path launched a kernel it should skip")


@pytest.fixture
def one_token_only(monkeypatch):
    """Fail if a one-token launch runs the align kernel."""
    monkeypatch.setattr(kernel_module, "_align_kernel", _Refuse())


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize(
    "experts, top_k, hidden, inter, n_active, bad_ids",
    [
        (8, 1, 32, 24, None, ()),
        (8, 4, 48, 64, None, ()),
        (16, 8, 100, 40, None, (3,)),
        (16, 8, 48, 24, 5, ()),
        (16, 8, 48, 24, 0, ()),
        (60, 8, 64, 96, 6, (1, 7)),
    ],
)
def test_one_token_matches_reference(
    poisoned, one_token_only, dtype, transposed, experts, top_k, hidden, inter, n_active, bad_ids
):
    """T == 1 (no align launch): against the float64 reference with and without expert skipping, with ids outside
    [0, E) (-1 and E) at some ranks, weights in both layouts."""
    x, w_gate_up, w_down, index, weights, _ = make_inputs(
        1, experts, top_k, hidden, inter, dtype, seed=experts + top_k
    )
    for j, rank in enumerate(bad_ids):
        index[0, rank] = -1 if j % 2 == 0 else experts
    active = torch.tensor([n_active]) if n_active is not None else None
    gate_up, down = w_gate_up, w_down
    if transposed:
        gate_up, down = w_gate_up.transpose(1, 2).contiguous(), w_down.transpose(1, 2).contiguous()
    out = fused_experts(x, gate_up, down, index, weights, active, transposed=transposed)
    check(out, reference(x, w_gate_up, w_down, index, weights, active), dtype)
    if n_active == 0:
        assert torch.equal(out, torch.zeros_like(out))


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("skip", [False, True])
def test_one_token_path_equals_four_launch_path(dtype, skip):
    """Each token's row of a many-token launch (align, gate_up, down, sum) equals the one-token launch of that token
    bit for bit: the same rounding points and the same rank-order float32 sum."""
    x, w_gate_up, w_down, index, weights, n_active = make_inputs(5, 16, 8, 64, 48, dtype, seed=11, skip=skip)
    many = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    for t in range(5):
        active = n_active[t : t + 1] if skip else None
        one = kernel_module.launch(
            x[t : t + 1], w_gate_up, w_down, index[t : t + 1], weights[t : t + 1], active, False
        )
        assert torch.equal(one[0], many[t]), t


@needs_triton
def test_one_token_never_reads_unselected_experts(poisoned, one_token_only):
    x, w_gate_up, w_down, index, weights, _ = make_inputs(1, 16, 8, 32, 24, seed=13)
    n_active = torch.tensor([5])
    unused = torch.ones(16, dtype=torch.bool)
    unused[index[0, :5]] = False
    w_gate_up[unused], w_down[unused] = float("nan"), float("nan")
    out = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    check(out, reference(x, w_gate_up, w_down, index, weights, n_active), torch.float32)


@pytest.fixture
def no_align(monkeypatch):
    """Fail if a launch runs the align kernel."""
    monkeypatch.setattr(kernel_module, "_align_kernel", _Refuse())


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, skip", [(2, False), (7, True), (16, True), (16, False)])
def test_expert_grid_equals_aligned_layout(monkeypatch, dtype, tokens, skip):
    """2 .. EXPERT_GRID_MAX_TOKENS tokens run the EXPERTS layout (no align launch) and give the ALIGNED layout's
    result bit for bit (same rounding points, same rank-order sum), with ids outside [0, E) at some pairs."""
    x, w_gate_up, w_down, index, weights, n_active = make_inputs(
        tokens, 16, 8, 64, 48, dtype, seed=tokens, skip=skip
    )
    index[0, 3], index[-1, 0] = -1, 16
    assert kernel_module._layout(index, n_active, 16).code == kernel_module.EXPERTS
    with monkeypatch.context() as m:
        m.setattr(kernel_module, "_align_kernel", _Refuse())
        grid = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    monkeypatch.setattr(kernel_module, "EXPERT_GRID_MAX_TOKENS", 1)
    assert kernel_module._layout(index, n_active, 16).code == kernel_module.ALIGNED
    aligned = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    if grid.is_cuda or dtype != torch.float32:
        assert torch.equal(grid, aligned)
    else:  # the interpreter's float32 dots are numpy matmuls, whose sum order can depend on the tile's row count
        torch.testing.assert_close(grid, aligned, rtol=1e-6, atol=1e-6)
    check(grid, reference(x, w_gate_up, w_down, index, weights, n_active), dtype)


@needs_triton
@pytest.mark.parametrize("tokens", [3, 20])
def test_repeated_expert_ids_count_every_pair(poisoned, tokens):
    """A token whose ids repeat an expert gets that expert once per pair, weighted by each pair's weight, in both
    the EXPERTS (3 tokens) and the ALIGNED (20 tokens) layout."""
    x, w_gate_up, w_down, index, weights, n_active = make_inputs(tokens, 8, 4, 32, 24, seed=17, skip=True)
    index[1] = torch.tensor([5, 2, 5, 5])
    n_active[1] = 3  # the last repeat is dropped
    out = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    check(out, reference(x, w_gate_up, w_down, index, weights, n_active), torch.float32)


@needs_triton
def test_expert_grid_never_reads_unselected_experts(poisoned, no_align):
    """EXPERTS layout: NaN weights in every expert no active pair selects; those programs return before loading."""
    x, w_gate_up, w_down, index, weights, _ = make_inputs(8, 16, 4, 32, 24, seed=19)
    n_active = torch.tensor([4, 1, 0, 2, 3, 4, 1, 2])
    used = index[active_pairs(index, 16, n_active)].unique()
    unused = torch.ones(16, dtype=torch.bool)
    unused[used] = False
    assert unused.sum() >= 2
    w_gate_up[unused], w_down[unused] = float("nan"), float("nan")
    out = kernel_module.launch(x, w_gate_up, w_down, index, weights, n_active, False)
    check(out, reference(x, w_gate_up, w_down, index, weights, n_active), torch.float32)
