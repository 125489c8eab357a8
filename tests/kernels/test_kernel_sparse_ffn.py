"""Sparse FFN kernels: the fused gated activation, the sparse gate/up, the masked down projection, the kept-channel
list and the fused sparse MLP (Triton, interpreted on CPU) vs the float64 references on odd shapes (several row tiles, several down splits, nothing or
everything kept), both layouts of the down weight, skipped weight rows never read, poisoned buffers, the CPU fallback
of the custom ops, input checks and the benchmark cases."""

from __future__ import annotations

import doctest

import pytest
import torch
import torch.nn.functional as F

import hf_sparse_verify.kernels.sparse_ffn.op as op_module
from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.sparse_ffn import (
    channel_mask_naive,
    gated_act,
    gated_act_naive,
    masked_down,
    masked_down_naive,
    sparse_ffn,
    sparse_gate_up,
    sparse_gate_up_naive,
    sparse_mlp_naive,
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
    """Every buffer a launch allocates starts as NaN (integer buffers: 7, neither 0 nor 1), so a read of an
    unwritten element shows in the output."""

    def empty(shape, device, dtype):
        return torch.full(shape, float("nan") if dtype.is_floating_point else 7, device=device, dtype=dtype)

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
    """``x [B, q, H]``, weights and a threshold on the row maxima of ``|silu(gate)|`` that skips about ``skipped`` of
    the (row, channel) pairs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, q_len, hidden, generator=g).to(DEVICE, dtype)
    w_gate, w_up, w_down = weights(hidden, inter, dtype, seed)
    act = F.silu(x @ w_gate.T)
    row_max = act.abs().amax(dim=1).float().flatten().sort().values
    if 0.0 < skipped < 1.0:  # midway between two row maxima: no value sits at tau
        i = min(max(1, int(skipped * row_max.numel())), row_max.numel() - 1)
        tau = (row_max[i - 1] + row_max[i]) / 2
    else:
        tau = torch.tensor(0.0 if skipped == 0 else 1e9, device=DEVICE)
    return x, w_gate, w_up, w_down, tau.float()


SHAPES = [
    (1, 1, 32, 48, 0.5),
    (1, 5, 48, 40, 0.75),
    (3, 4, 40, 72, 0.3),
    (2, 8, 24, 300, 0.6),  # several down splits
    (4, 17, 32, 33, 0.5),  # q past 16: BLOCK_Q 32
    (9, 16, 32, 40, 0.5),  # 9 rows of 16 tokens: two row tiles (8 batch rows each), the second one ragged
    (2, 3, 32, 48, 0.0),  # every channel kept
    (2, 3, 32, 48, 1.0),  # none kept
]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, q_len, hidden, inter, skipped", SHAPES)
def test_sparse_gate_up_matches_reference(poisoned, dtype, batch, q_len, hidden, inter, skipped):
    x, w_gate, w_up, _, tau = inputs(batch, q_len, hidden, inter, dtype, skipped, seed=batch * q_len)
    h, keep = kernel_module.sparse_gate_up_launch(x, w_gate, w_up, tau)
    keep = keep.bool()
    if dtype == torch.float32:
        ref_h, ref_keep = sparse_gate_up_naive(x.double(), w_gate.double(), w_up.double(), tau)
        assert torch.equal(keep, ref_keep)
    else:  # the reference's bf16 rounding, float32 sums: the masks differ only where a value sits at tau
        ref_h, ref_keep = sparse_gate_up_naive(x, w_gate, w_up, tau)
        assert (keep != ref_keep).float().mean() <= 0.05
        agree = (keep == ref_keep)[:, None, :]
        h, ref_h = torch.where(agree, h, 0), torch.where(agree, ref_h, 0)
    check(h, ref_h, dtype)
    if skipped == 0.0:
        assert keep.all()
    if skipped == 1.0:
        assert not keep.any() and (h == 0).all()
    if 0.0 < skipped < 1.0:
        assert 0 < keep.float().mean() < 1  # the threshold splits the channels: the mask matters here


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, q_len, hidden, inter, skipped", SHAPES)
@pytest.mark.parametrize("down_layout", ["copy", "view"])
def test_masked_down_matches_reference(poisoned, dtype, batch, q_len, hidden, inter, skipped, down_layout):
    x, w_gate, w_up, w_down, tau = inputs(batch, q_len, hidden, inter, dtype, skipped, seed=batch + q_len)
    h, keep = sparse_gate_up_naive(x, w_gate, w_up, tau)
    w_down_t = w_down.T.contiguous() if down_layout == "copy" else w_down.T
    out = kernel_module.masked_down_launch(h, w_down_t, keep)
    check(out, masked_down_naive(h.double(), w_down_t.double(), keep), dtype)
    if skipped == 1.0:
        assert (out == 0).all()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch, q_len, hidden, inter, skipped", SHAPES)
@pytest.mark.parametrize("down_layout", ["copy", "view"])
def test_sparse_ffn_launch_matches_reference(
    poisoned, dtype, batch, q_len, hidden, inter, skipped, down_layout
):
    """The fused path (one channel list for up and down, up written compacted) against the float64 reference; in
    bf16 against the reference's own bf16 mask, since a value at tau may fall either way."""
    x, w_gate, w_up, w_down, tau = inputs(batch, q_len, hidden, inter, dtype, skipped, seed=batch + 2 * q_len)
    w_down_t = w_down.T.contiguous() if down_layout == "copy" else w_down.T
    out = kernel_module.sparse_ffn_launch(x, w_gate, w_up, w_down_t, tau)
    if dtype == torch.float32:
        ref = sparse_mlp_naive(x.double(), w_gate.double(), w_up.double(), w_down.double(), tau)
    else:  # the kernel's mask (checked against the reference's), then the reference's bf16 products under it
        keep = kernel_module._gate_keep(x, w_gate, tau)[1].bool()
        dense_h, _ = sparse_gate_up_naive(x, w_gate, w_up, torch.zeros(()))
        assert (keep != sparse_gate_up_naive(x, w_gate, w_up, tau)[1]).float().mean() <= 0.05
        h = torch.where(keep[:, None, :], dense_h, 0)
        ref = masked_down_naive(h.double(), w_down_t.double(), keep)
    check(out, ref, dtype)
    if skipped == 1.0:
        assert (out == 0).all()


@needs_triton
@pytest.mark.parametrize("up_split, up_k", [(1, 16), (2, 32), (4, 16), (3, 16)])
@pytest.mark.parametrize("batch, q_len, skipped", [(1, 16, 0.5), (3, 5, 0.75)])
def test_up_split_over_hidden(poisoned, monkeypatch, up_split, up_k, batch, q_len, skipped):
    """The up projection with the hidden dimension split over programs (partial sums added by the last split to
    arrive), ragged last split included (100 = 32 + 32 + 32 + 4 at 16-wide steps), against the reference."""
    monkeypatch.setitem(kernel_module.TILES, "up_split", up_split)
    monkeypatch.setitem(kernel_module.TILES, "up_k", up_k)
    x, w_gate, w_up, w_down, tau = inputs(batch, q_len, 100, 72, torch.float32, skipped, seed=up_split)
    ref = sparse_mlp_naive(x.double(), w_gate.double(), w_up.double(), w_down.double(), tau)
    for _ in range(2):  # the arrival counters start from zero on every call
        check(
            kernel_module.sparse_ffn_launch(x, w_gate, w_up, w_down.T.contiguous(), tau), ref, torch.float32
        )
    h, keep = kernel_module.sparse_gate_up_launch(x, w_gate, w_up, tau)
    ref_h, ref_keep = sparse_gate_up_naive(x.double(), w_gate.double(), w_up.double(), tau)
    assert torch.equal(keep.bool(), ref_keep)
    check(h, ref_h, torch.float32)


@needs_triton
@pytest.mark.parametrize("batch, inter, share", [(1, 300, 0.3), (3, 4500, 0.5), (2, 40, 0.0), (2, 40, 1.0)])
def test_kept_channels_lists_the_union_in_order(poisoned, batch, inter, share):
    """The channel list: every channel some row keeps, ascending, then the count in the last slot (several list
    chunks at 4500 channels)."""
    g = torch.Generator().manual_seed(inter)
    keep = (torch.rand(batch, inter, generator=g) < share).to(DEVICE)
    channels = kernel_module.kept_channels_launch(keep)
    want = keep.any(0).nonzero().flatten()
    count = int(channels[inter])
    assert channels.dtype == torch.int32 and channels.shape == (inter + 1,)
    assert count == want.numel() and torch.equal(channels[:count].long(), want)


@needs_triton
@pytest.mark.parametrize("batch, skipped", [(2, 0.7), (9, 0.95)])
def test_sparse_kernels_read_only_kept_rows(poisoned, batch, skipped):
    """NaN in every row of ``w_up`` and ``w_down_t`` that no batch row keeps: the output stays finite, so those rows
    are never read."""
    x, w_gate, w_up, w_down, tau = inputs(batch, 4, 32, 64, torch.float32, skipped, seed=3)
    ref = sparse_mlp_naive(x.double(), w_gate.double(), w_up.double(), w_down.double(), tau)
    _, keep = sparse_gate_up_naive(x, w_gate, w_up, tau)
    used = keep.any(0)  # channels kept by some row
    assert not used.all()
    w_up, w_down_t = w_up.clone(), w_down.T.contiguous()
    w_up[~used] = float("nan")
    w_down_t[~used] = float("nan")
    h, keep = kernel_module.sparse_gate_up_launch(x, w_gate, w_up, tau)
    check(kernel_module.masked_down_launch(h, w_down_t, keep), ref, torch.float32)
    check(kernel_module.sparse_ffn_launch(x, w_gate, w_up, w_down_t, tau), ref, torch.float32)


def test_mask_is_max_over_the_rows_tokens():
    act = torch.zeros(2, 3, 4)
    act[0, 2, 1] = -0.5  # one token of row 0 reaches tau on channel 1
    act[1, 0, 3] = 0.5
    act[1, 1, 0] = 0.49  # under tau
    assert channel_mask_naive(act, torch.tensor(0.5)).tolist() == [
        [False, True, False, False],
        [False, False, False, True],
    ]


def test_threshold_compared_in_float32():
    """A bf16 activation just under a float32 tau is skipped even where tau rounds to it in bf16."""
    act = torch.full((1, 1, 2), 1.0, dtype=torch.bfloat16)
    assert not channel_mask_naive(act, torch.tensor(1.0001)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_ffn_equals_zeroed_channels(dtype):
    """The public op (Triton when interpreting, else the reference) vs the dense MLP with skipped channels zeroed;
    tau = 0 is the dense MLP."""
    x, w_gate, w_up, w_down, tau = inputs(3, 5, 32, 64, dtype, 0.5, seed=11)
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
    x, w_gate, w_up, w_down, tau = inputs(2, 3, 16, 24, torch.float32, 0.5)
    assert torch.equal(gated_act(x, w_gate, w_up), gated_act_naive(x, w_gate, w_up))
    h, keep = sparse_gate_up(x, w_gate, w_up, tau)
    ref_h, ref_keep = sparse_gate_up_naive(x, w_gate, w_up, tau)
    assert torch.equal(h, ref_h) and torch.equal(keep, ref_keep)
    assert torch.equal(masked_down(h, w_down.T, keep), masked_down_naive(h, w_down.T, keep))
    assert torch.equal(sparse_ffn(x, w_gate, w_up, w_down.T, tau), masked_down_naive(h, w_down.T, keep))


def test_input_checks():
    x, w_gate, w_up, w_down, tau = inputs(2, 3, 16, 24, torch.float32, 0.5)
    h, keep = sparse_gate_up(x, w_gate, w_up, tau)
    with pytest.raises(ValueError, match=r"w_gate, w_up \[I, H\]"):
        gated_act(x, w_gate[:, :8], w_up)
    with pytest.raises(ValueError, match="share one float dtype"):
        gated_act(x.half(), w_gate, w_up)
    with pytest.raises(ValueError, match=r"x \[B, q, H\]"):
        sparse_gate_up(x[0], w_gate, w_up, tau)
    with pytest.raises(ValueError, match="at most 128 verify tokens"):
        sparse_gate_up(torch.zeros(1, 129, 16), w_gate, w_up, tau)
    with pytest.raises(ValueError, match="one threshold per layer"):
        sparse_gate_up(x, w_gate, w_up, torch.zeros(2))
    with pytest.raises(ValueError, match=r"pass down_proj.weight.T"):
        masked_down(h, w_down, keep)
    with pytest.raises(ValueError, match=r"pass down_proj.weight.T"):
        sparse_ffn(x, w_gate, w_up, w_down, tau)
    with pytest.raises(ValueError, match="at most 128 verify tokens"):
        sparse_ffn(torch.zeros(1, 129, 16), w_gate, w_up, w_down.T, tau)
    with pytest.raises(ValueError, match="x's dtype"):
        sparse_ffn(x, w_gate, w_up, w_down.T.double(), tau)
    with pytest.raises(ValueError, match="keep must be bool"):
        masked_down(h, w_down.T, keep.int())
    with pytest.raises(ValueError, match="share one float dtype"):
        masked_down(h.double(), w_down.T, keep)


def test_docstring_examples():
    results = doctest.testmod(op_module, extraglobs={"torch": torch, "F": F})
    assert results.attempted >= 4 and results.failed == 0


def test_bench_cases_run():
    from hf_sparse_verify.kernels.bench_registry import load_all

    registry = load_all()
    for name in ("gated_act", "sparse_ffn"):
        cases = list(registry[name](torch.device("cpu"), torch.float32, True))
        assert len(cases) >= 6
        for case in cases[:3]:
            assert case.bytes_moved > 0 and case.run() is not None
