"""Sparse FFN kernels: the fused gated activation and the sparse up/down (Triton, interpreted on CPU) vs the float64
references on odd shapes, the compaction vs its loop reference, count = 0 and count = I, both layouts of the down
weight, poisoned buffers, the CPU fallback of the custom ops, input checks and the benchmark cases."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F

import hf_sparse_verify.kernels.sparse_ffn.op as op_module
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.sparse_ffn import (
    channel_mask_naive,
    compact_naive,
    gate_activations,
    gated_act,
    gated_act_naive,
    kept_channels,
    sparse_ffn,
    sparse_mlp_naive,
    sparse_up_down,
    sparse_up_down_naive,
)
from hf_sparse_verify.kernels.sparse_ffn import kernel as kernel_module

#: compiled kernels on a CUDA GPU, else the interpreter on CPU (TRITON_INTERPRET=1)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    not triton_runs_on(DEVICE), reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1"
)
#: relative to the output's scale. float32: summation order only; bf16: the kernels round gate, up and their
#: product to bf16 (the float64 reference does not), and the CPU interpreter truncates where the GPU rounds
TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer a launch allocates starts as NaN, so a read of an unwritten element shows in the output."""

    def empty(shape, device, dtype):
        return torch.full(shape, float("nan"), device=device, dtype=dtype)

    monkeypatch.setattr(kernel_module, "_empty", empty)


def weights(hidden, inter, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_gate = torch.randn(inter, hidden, generator=g) / hidden**0.5
    w_up = torch.randn(inter, hidden, generator=g) / hidden**0.5
    w_down = torch.randn(hidden, inter, generator=g) / inter**0.5
    return w_gate.to(DEVICE, dtype), w_up.to(DEVICE, dtype), w_down.to(DEVICE, dtype)


def check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape and torch.isfinite(out).all()
    scale = ref.abs().max().clamp_min(1.0)
    torch.testing.assert_close(out.double() / scale, ref.double() / scale, rtol=0, atol=TOL[dtype])


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden, inter", [(1, 32, 48), (5, 48, 40), (16, 40, 72), (63, 24, 33)])
def test_gated_act_matches_reference(poisoned, dtype, rows, hidden, inter):
    g = torch.Generator().manual_seed(rows + hidden)
    x = (torch.randn(rows, hidden, generator=g) * 2).to(DEVICE, dtype)
    w_gate, w_up, _ = weights(hidden, inter, dtype, seed=rows)
    out = kernel_module.gated_act_launch(x, w_gate, w_up)
    check(out, gated_act_naive(x.double(), w_gate.double(), w_up.double()), dtype)


@needs_triton
def test_gated_act_op_reshapes_and_strides():
    x = torch.randn(2, 3, 2 * 24, device=DEVICE)[..., ::2]  # [2, 3, 24], last dim strided
    w_gate, w_up, _ = weights(24, 40, torch.float32)
    out = gated_act(x, w_gate, w_up)
    assert out.shape == (2, 3, 40)
    check(out, gated_act_naive(x.double(), w_gate.double(), w_up.double()), torch.float32)


def inputs(batch, q_len, hidden, inter, dtype, skipped, seed=0):
    """``x [B, q, H]``, activations, weights and a threshold that skips about ``skipped`` of the channels."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, q_len, hidden, generator=g).to(DEVICE, dtype)
    w_gate, w_up, w_down = weights(hidden, inter, dtype, seed)
    act = gate_activations(x, w_gate)
    row_max = act.abs().amax(dim=1).float().flatten()
    tau = (
        torch.quantile(row_max, skipped)
        if 0.0 < skipped < 1.0
        else torch.tensor(0.0 if skipped == 0 else 1e9, device=DEVICE)
    )
    return x, act, w_gate, w_up, w_down, tau.float()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "batch, q_len, hidden, inter, skipped",
    [
        (1, 1, 32, 48, 0.5),
        (1, 5, 48, 40, 0.75),
        (3, 4, 40, 72, 0.3),
        (2, 8, 24, 300, 0.6),  # several down splits
        (4, 17, 32, 33, 0.5),  # q past 16: BLOCK_Q 32
        (2, 3, 32, 48, 0.0),  # count = I
        (2, 3, 32, 48, 1.0),  # count = 0
    ],
)
@pytest.mark.parametrize("down_layout", ["copy", "view"])
def test_sparse_up_down_matches_reference(poisoned, dtype, batch, q_len, hidden, inter, skipped, down_layout):
    x, act, _, w_up, w_down, tau = inputs(batch, q_len, hidden, inter, dtype, skipped, seed=batch * q_len)
    index, count = kept_channels(act, tau)
    if skipped == 0.0:
        assert (count == inter).all()
    if skipped == 1.0:
        assert (count == 0).all()
    w_down_t = w_down.T.contiguous() if down_layout == "copy" else w_down.T
    out = kernel_module.sparse_up_down_launch(x, act, w_up, w_down_t, index, count)
    ref = sparse_up_down_naive(x.double(), act.double(), w_up.double(), w_down_t.double(), index, count)
    check(out, ref, dtype)
    if skipped == 1.0:
        assert (out == 0).all()


@needs_triton
def test_sparse_up_down_reads_only_kept_rows(poisoned):
    """NaN in every skipped row of ``w_up`` and ``w_down_t``: the output stays finite, so those rows are never
    read (and a wrong channel id would pick up a NaN)."""
    x, act, _, w_up, w_down, tau = inputs(2, 4, 32, 64, torch.float32, 0.5, seed=3)
    index, count = kept_channels(act, tau)
    keep = channel_mask_naive(act, tau).any(0)  # channels kept by some row
    assert not keep.all()
    ref = sparse_up_down_naive(x.double(), act.double(), w_up.double(), w_down.T.double(), index, count)
    w_up, w_down_t = w_up.clone(), w_down.T.contiguous()
    w_up[~keep] = float("nan")
    w_down_t[~keep] = float("nan")
    check(kernel_module.sparse_up_down_launch(x, act, w_up, w_down_t, index, count), ref, torch.float32)


@pytest.mark.parametrize("batch, q_len, inter", [(1, 1, 7), (3, 4, 50), (2, 9, 128)])
def test_kept_channels_matches_loop_reference(batch, q_len, inter):
    act = torch.randn(batch, q_len, inter, generator=torch.Generator().manual_seed(inter)).to(DEVICE)
    for tau in (0.0, 0.8, 1.5, 1e9):
        index, count = kept_channels(act, torch.tensor(tau))
        ref_index, ref_count = compact_naive(channel_mask_naive(act, tau))
        assert index.dtype == count.dtype == torch.int32
        assert torch.equal(index, ref_index) and torch.equal(count, ref_count)


def test_mask_is_max_over_the_rows_tokens():
    act = torch.zeros(2, 3, 4)
    act[0, 2, 1] = -0.5  # one token of row 0 reaches tau on channel 1
    act[1, 0, 3] = 0.5
    act[1, 1, 0] = 0.49  # under tau
    index, count = kept_channels(act, torch.tensor(0.5))
    assert count.tolist() == [1, 1] and index[:, 0].tolist() == [1, 3]


def test_threshold_compared_in_float32():
    """A bf16 activation just under a float32 tau is skipped even where tau rounds to it in bf16."""
    act = torch.full((1, 1, 2), 1.0, dtype=torch.bfloat16)
    _, count = kept_channels(act, torch.tensor(1.0001))
    assert count.tolist() == [0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_ffn_equals_zeroed_channels(dtype):
    """The public op (Triton when interpreting, else the reference) vs the dense MLP with skipped channels zeroed;
    tau = 0 is the dense MLP."""
    x, _, w_gate, w_up, w_down, tau = inputs(3, 5, 32, 64, dtype, 0.5, seed=11)
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        sparse_ffn(x, w_gate, w_up, w_down.T.contiguous(), tau),
        sparse_mlp_naive(x, w_gate, w_up, w_down, tau),
        **tol,
    )
    dense = (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
    zero = torch.tensor(0.0)
    torch.testing.assert_close(sparse_ffn(x, w_gate, w_up, w_down.T, zero), dense, **tol)
    assert not torch.allclose(sparse_mlp_naive(x, w_gate, w_up, w_down, tau), dense, atol=1e-3)  # tau matters


def test_ops_fall_back_to_the_reference(monkeypatch):
    """Where Triton cannot run (CPU without TRITON_INTERPRET) the ops compute the references."""
    monkeypatch.setattr(op_module, "triton_runs_on", lambda device: False)
    x, act, w_gate, w_up, w_down, tau = inputs(2, 3, 16, 24, torch.float32, 0.5)
    index, count = kept_channels(act, tau)
    assert torch.equal(gated_act(x, w_gate, w_up), gated_act_naive(x, w_gate, w_up))
    assert torch.equal(
        sparse_up_down(x, act, w_up, w_down.T, index, count),
        sparse_up_down_naive(x, act, w_up, w_down.T, index, count),
    )


def test_input_checks():
    x, act, w_gate, w_up, w_down, tau = inputs(2, 3, 16, 24, torch.float32, 0.5)
    index, count = kept_channels(act, tau)
    with pytest.raises(ValueError, match=r"w_gate, w_up \[I, H\]"):
        gated_act(x, w_gate[:, :8], w_up)
    with pytest.raises(ValueError, match="share one float dtype"):
        gated_act(x.half(), w_gate, w_up)
    with pytest.raises(ValueError, match=r"pass down_proj.weight.T"):
        sparse_up_down(x, act, w_up, w_down, index, count)
    with pytest.raises(ValueError, match=r"x \[B, q, H\]"):
        sparse_up_down(x[0], act, w_up, w_down.T, index, count)
    with pytest.raises(ValueError, match="index must be"):
        sparse_up_down(x, act, w_up, w_down.T, index.float(), count)
    with pytest.raises(ValueError, match="share one int dtype"):
        sparse_up_down(x, act, w_up, w_down.T, index, count.long())
    with pytest.raises(ValueError, match=r"act \[B, q, I\]"):
        kept_channels(act[0], tau)


def test_docstring_examples():
    results = doctest.testmod(op_module, extraglobs={"torch": torch, "F": F})
    assert results.attempted >= 4 and results.failed == 0


def test_bench_cases_run():
    from hf_sparse_verify.kernels.registry import load_all

    registry = load_all()
    for name in ("gated_act", "sparse_ffn"):
        cases = list(registry[name](torch.device("cpu"), torch.float32, True))
        assert len(cases) >= 6
        for case in cases[:3]:
            assert case.bytes_moved > 0 and case.run() is not None
