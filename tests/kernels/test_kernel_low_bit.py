"""Low-bit weight formats (the reference): rounding error bounds, layout, bytes, clear errors."""

from __future__ import annotations

import doctest

import pytest
import torch

import hf_sparse_verify.kernels.low_bit.naive as naive
from hf_sparse_verify.kernels.low_bit import dequantize, fake_quantize, quantize, quantized_bytes
from hf_sparse_verify.kernels.low_bit.tinygemm import tinygemm_values


def _weight(out=48, inp=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen)
    w[3] = 0.0  # an all-zero row
    w[5, :64] *= 20.0  # one group with outliers
    return w


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 128), ("int4", 32)])
def test_rounding_error_is_at_most_half_a_step(fmt, group):
    w = _weight()
    values, scales = quantize(w, fmt, group)
    assert values.dtype == torch.int8 and values.shape == w.shape
    top, low, grouped = naive.LOW_BIT_FORMATS[fmt]
    assert int(values.max()) <= top and int(values.min()) >= low
    assert scales.shape == ((w.shape[0], w.shape[1] // group) if grouped else (w.shape[0], 1))
    back = dequantize(values, scales, fmt)
    step = scales.repeat_interleave(w.shape[1] // scales.shape[1], dim=1)
    assert bool(((back - w).abs() <= step / 2 + 1e-6).all())
    assert bool((back[3] == 0).all())  # zero rows stay zero


def test_int4_groups_confine_outliers():
    """An outlier group's scale does not coarsen the rest of its row (the reason for groups)."""
    w = _weight()
    row_error = (fake_quantize(w, "int4", 256)[5, 64:] - w[5, 64:]).abs().mean()
    group_error = (fake_quantize(w, "int4", 64)[5, 64:] - w[5, 64:]).abs().mean()
    assert group_error < 0.2 * row_error


def test_fake_quantize_keeps_dtype_and_bytes_count_packing():
    w = _weight().to(torch.bfloat16)
    assert fake_quantize(w, "int8").dtype == torch.bfloat16
    assert quantized_bytes(w, "int8") == 48 * 256 + 2 * 48
    assert quantized_bytes(w, "int4", 128) == 48 * 256 // 2 + 2 * 48 * 2
    assert quantized_bytes(w, "int4", 128) < w.nbytes / 3


def test_bad_input_says_what_to_change():
    w = _weight()
    with pytest.raises(ValueError, match="one of"):
        quantize(w, "int3")
    with pytest.raises(ValueError, match="divide"):
        quantize(w, "int4", 100)
    with pytest.raises(ValueError, match=r"\[out, in\]"):
        quantize(w[0], "int8")


def test_docstring_examples():
    assert doctest.testmod(naive).failed == 0


# ---- the weight-only low-bit linear (hsv::low_bit_linear): Triton (interpreted on CPU) against the reference ----


def _layer(out, inp, fmt, group, dtype, seed=0, rounding="absmax"):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen) * 0.05
    values, scales = quantize(w, fmt, group, rounding)
    return naive.pack(values, fmt), scales, values


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 32), ("int4", 128)])
def test_mse_rounding_is_never_worse_than_absmax(fmt, group):
    """Per group, the "mse" scale's squared error is at most "absmax"'s (whose scale is among its candidates), and
    for int4 it is clearly lower over a weight with outliers; values stay in the format's range."""
    w = _weight(out=64, inp=512)
    errors = {}
    for rounding in ("absmax", "mse"):
        values, scales = quantize(w, fmt, group, rounding)
        top, low, _ = naive.LOW_BIT_FORMATS[fmt]
        assert int(values.min()) >= low and int(values.max()) <= top
        size = group if fmt == "int4" else 512
        errors[rounding] = (dequantize(values, scales, fmt) - w).square().view(64, -1, size).sum(-1)
    assert bool((errors["mse"] <= errors["absmax"] * (1 + 1e-6)).all())
    if fmt == "int4":  # int8's 255 levels leave little to gain
        assert float(errors["mse"].sum()) < 0.9 * float(errors["absmax"].sum())
    with pytest.raises(ValueError, match="rounding must be one of"):
        quantize(w, fmt, group, "awq")


def test_pack_round_trips_and_halves_int4():
    values, _ = quantize(_weight(), "int4", 32)
    stored = naive.pack(values, "int4")
    assert stored.dtype == torch.uint8 and stored.shape == (48, 128)
    assert torch.equal(naive.unpack(stored, "int4"), values)
    # blocks of 32 channels as four little-endian int32 words: nibble i of word j is channel j + 4 i, value + 8
    words = stored.view(torch.int32)  # [48, 128 / 4]
    for block, j, i in [(0, 0, 0), (0, 1, 0), (0, 3, 7), (1, 2, 5), (3, 0, 1)]:
        nibble = (int(words[5, 4 * block + j]) >> (4 * i)) & 0xF
        assert nibble == int(values[5, 32 * block + j + 4 * i]) + 8
    with pytest.raises(ValueError, match="blocks of 32"):
        naive.pack(values[:, :48], "int4")
    assert naive.pack(values, "int8") is not None and torch.equal(naive.unpack(values, "int8"), values)


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 128), ("int4", 32), ("int4", 256)])
@pytest.mark.parametrize("rows", [1, 5, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rounding", ["absmax", "mse"])  # "mse" gives some int4 groups a negative scale
def test_low_bit_linear_matches_reference(fmt, group, rows, dtype, rounding):
    from hf_sparse_verify.kernels.low_bit import low_bit_linear, low_bit_linear_naive

    stored, scales, values = _layer(80, 512, fmt, group, dtype, rounding=rounding)
    assert rounding == "absmax" or fmt == "int8" or bool((scales < 0).any())
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 512, generator=gen).to(dtype)
    bias = torch.randn(80, generator=gen).to(dtype)
    got = low_bit_linear(x, stored, scales, fmt, group, bias)
    ref = low_bit_linear_naive(x, stored, scales, fmt, bias)
    exact = torch.nn.functional.linear(
        x.double(), dequantize(values, scales, fmt, torch.float64), bias.double()
    )
    assert got.dtype == dtype and got.shape == (rows, 80)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), exact, rtol=tol, atol=tol)
    torch.testing.assert_close(ref.double(), exact, rtol=tol, atol=tol)


def test_low_bit_linear_keeps_leading_dims_and_says_what_is_wrong():
    from hf_sparse_verify.kernels.low_bit import low_bit_linear

    stored, scales, _ = _layer(32, 128, "int4", 32, torch.float32)
    x = torch.randn(2, 3, 128)
    assert low_bit_linear(x, stored, scales, "int4", 32).shape == (2, 3, 32)
    with pytest.raises(ValueError, match="input channels"):
        low_bit_linear(torch.randn(2, 64), stored, scales, "int4", 32)
    with pytest.raises(ValueError, match="format"):
        low_bit_linear(x, stored, scales, "int2", 32)


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 64)])
def test_low_bit_linear_with_input_size_not_a_multiple_of_the_block(fmt, group):
    """192 input channels: the int8 loop's last block of 128 is half masked; int4 groups of 64 make three blocks."""
    from hf_sparse_verify.kernels.low_bit import low_bit_linear

    stored, scales, values = _layer(40, 192, fmt, group, torch.float32)
    x = torch.randn(3, 192, generator=torch.Generator().manual_seed(2))
    exact = torch.nn.functional.linear(x.double(), dequantize(values, scales, fmt, torch.float64))
    torch.testing.assert_close(
        low_bit_linear(x, stored, scales, fmt, group).double(), exact, rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 64), ("int4", 128)])
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("rows", [2, 5])  # int4: the elementwise kernel (up to GEMV_ROWS rows), then tl.dot
def test_low_bit_linear_split_over_input_channels(monkeypatch, fmt, group, split, rows):
    """Split K (partial sums per slice of input channels, then the fixed-order reduction with the bias): the same
    result as one pass, and every call the same bits. 896 channels: the slices are uneven (7 int8 blocks)."""
    import hf_sparse_verify.kernels.low_bit.kernel as kernel
    from hf_sparse_verify.kernels.low_bit import low_bit_linear

    stored, scales, values = _layer(48, 896, fmt, group, torch.float32)
    gen = torch.Generator().manual_seed(3)
    x, bias = torch.randn(rows, 896, generator=gen), torch.randn(48, generator=gen)
    exact = torch.nn.functional.linear(
        x.double(), dequantize(values, scales, fmt, torch.float64), bias.double()
    )
    monkeypatch.setitem(kernel.TILES, "split_k", split)
    monkeypatch.setitem(kernel.GEMV_TILES, "split_k", split)
    got = low_bit_linear(x, stored, scales, fmt, group, bias)
    torch.testing.assert_close(got.double(), exact, rtol=1e-4, atol=1e-4)
    assert torch.equal(got, low_bit_linear(x, stored, scales, fmt, group, bias))


def test_split_k_heuristic():
    """With "auto": enough slices for `PROGRAMS_PER_SM` programs per multiprocessor, each slice >= 4 blocks; one slice
    where the multiprocessors are unknown (CPU)."""
    from hf_sparse_verify.kernels.low_bit.kernel import PROGRAMS_PER_SM, split_k

    assert split_k(programs=128, n_blocks_k=112, sms=132) == -(-PROGRAMS_PER_SM * 132 // 128)
    assert split_k(programs=1024, n_blocks_k=32, sms=132) == 1  # enough programs already
    assert split_k(programs=1, n_blocks_k=8, sms=132) == 2  # slices stay >= 4 blocks
    assert split_k(programs=128, n_blocks_k=112, sms=None) == 1


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("block", [64, 256, 1024])
def test_int4_blocks_spanning_or_inside_groups(monkeypatch, group, block):
    """An int4 block of input channels covers several groups (each scaled by its own scale before the dot), lies
    inside one, or is cut by the end of the row (1024 channels with a block of 1024: none; 640: masked)."""
    import hf_sparse_verify.kernels.low_bit.kernel as kernel
    from hf_sparse_verify.kernels.low_bit import low_bit_linear

    monkeypatch.setitem(kernel.TILES, "block_k", block)
    monkeypatch.setitem(kernel.GEMV_TILES, "block_k", block)
    for inp in (1024, 640):
        stored, scales, values = _layer(32, inp, "int4", group, torch.float32, seed=inp)
        for rows in (2, 17):
            x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(4))
            exact = torch.nn.functional.linear(x.double(), dequantize(values, scales, "int4", torch.float64))
            got = low_bit_linear(x, stored, scales, "int4", group)
            torch.testing.assert_close(got.double(), exact, rtol=1e-4, atol=1e-4)


# ---- int4 through PyTorch's tinygemm (CUDA): the LowBitLinear layout chosen there ----

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="tinygemm runs on CUDA only")


def _linear(out, inp, dtype, device, bias=False, seed=0):
    torch.manual_seed(seed)
    linear = torch.nn.Linear(inp, out, bias=bias)
    with torch.no_grad():
        linear.weight.mul_(0.5)
        linear.weight[1, :32] *= 30.0  # one group with outliers
    return linear.to(device=device, dtype=dtype)


def test_low_bit_linear_layout_off_cuda_is_ours_and_bad_layouts_say_what_to_change():
    from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear

    linear = _linear(64, 256, torch.bfloat16, "cpu")
    assert LowBitLinear(linear, "int4", 64).layout == "packed"
    with pytest.raises(ValueError, match="layout='packed'"):
        LowBitLinear(linear, "int4", 64, layout="tinygemm")
    with pytest.raises(ValueError, match="layout must be one of"):
        LowBitLinear(linear, "int4", 64, layout="marlin")


@needs_cuda
@pytest.mark.parametrize("out,inp,group", [(64, 256, 32), (48, 320, 64), (1024, 4096, 128), (24, 512, 256)])
@pytest.mark.parametrize("rows", [1, 3, 8, 65])
def test_tinygemm_layout_matches_the_reference(out, inp, group, rows):
    """The tinygemm layer computes `low_bit_linear_naive` with the weight rounded to bf16 scales, and reads back
    the values it was built from."""
    from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear

    linear = _linear(out, inp, torch.bfloat16, "cuda", bias=True)
    layer = LowBitLinear(linear, "int4", group)
    assert layer.layout == "tinygemm" and layer.stored.dtype == torch.int32
    values, scales = quantize(linear.weight, "int4", group, layer.rounding)
    scales = scales.to(torch.bfloat16).float()
    got_values, got_scales = tinygemm_values(layer.stored, layer.scales, group, inp)
    assert torch.equal(got_values, values) and torch.equal(got_scales, scales)
    x = torch.randn(rows, inp, device="cuda", dtype=torch.bfloat16)
    weight = dequantize(values, scales, "int4", torch.bfloat16)
    expected = x.float() @ weight.float().t() + linear.bias.float()
    got = layer(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out)
    assert float((got.float() - expected).abs().max() / expected.abs().max()) < 1e-2
    assert torch.equal(layer.dequantized(torch.bfloat16), weight)
    with pytest.raises(ValueError, match="bf16"):
        layer(x.float())


@needs_cuda
def test_tinygemm_layout_is_picked_only_where_it_runs():
    from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear

    assert LowBitLinear(_linear(64, 256, torch.float32, "cuda"), "int4", 64).layout == "packed"
    assert LowBitLinear(_linear(64, 256, torch.bfloat16, "cuda"), "int8").layout == "packed"
    assert LowBitLinear(_linear(60, 256, torch.bfloat16, "cuda"), "int4", 64).layout == "packed"  # out % 8
    assert LowBitLinear(_linear(64, 256, torch.bfloat16, "cuda"), "int4", 16).layout == "packed"  # group
    assert (
        LowBitLinear(_linear(64, 256, torch.bfloat16, "cuda"), "int4", 64, layout="packed").layout == "packed"
    )


# ---- stacked projections (q / k / v, gate / up of a low-bit copy): one layer, each part its own rows ----


def _stack_case(fmt, group, device, dtype, biases=(False, True, False)):
    from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear, LowBitRows

    outs = (64, 16, 16) if device == "cpu" else (1024, 256, 256)
    linears = [
        _linear(out, 256, dtype, device, bias=b, seed=i) for i, (out, b) in enumerate(zip(outs, biases))
    ]
    layers = [LowBitLinear(linear, fmt, group) for linear in linears]
    whole = LowBitLinear.stack(layers)
    bounds = [0, *torch.tensor(outs).cumsum(0).tolist()]
    parts = [LowBitRows(whole, a, b) for a, b in zip(bounds, bounds[1:])]
    return layers, whole, parts


def _check_stack(layers, whole, parts, x, tol):
    for layer, part in zip(layers, parts):  # each part applies exactly its layer's weight
        assert torch.equal(part.dequantized(), layer.dequantized())
        torch.testing.assert_close(part(x).float(), layer(x).float(), rtol=tol, atol=tol)
        expected = (
            layer.bias if layer.bias is not None else torch.zeros_like(part.bias)
        )  # a missing one is zeros
        assert torch.equal(part.bias, expected)
    joined = torch.cat([layer(x) for layer in layers], dim=-1)
    torch.testing.assert_close(whole(x).float(), joined.float(), rtol=tol, atol=tol)
    assert whole.stored.nbytes == sum(m.stored.nbytes for m in layers)  # nothing added


@pytest.mark.parametrize("fmt,group", [("int8", 128), ("int4", 32), ("int4", 128)])
def test_stacked_layer_computes_its_parts(fmt, group):
    """A stack of q / k / v-like layers (one with a bias) computes their outputs side by side, and each of its
    `LowBitRows` reads and computes only its own layer."""
    layers, whole, parts = _stack_case(fmt, group, "cpu", torch.float32)
    x = torch.randn(2, 3, 256, generator=torch.Generator().manual_seed(1))
    _check_stack(layers, whole, parts, x, 1e-5)


def test_stacks_say_what_does_not_fit():
    from hf_sparse_verify.integrations.low_bit_linear import LowBitLinear, LowBitRows, stacked_whole

    a = LowBitLinear(_linear(16, 256, torch.float32, "cpu"), "int4", 32)
    with pytest.raises(ValueError, match="one format, group"):
        LowBitLinear.stack([a, LowBitLinear(_linear(16, 128, torch.float32, "cpu"), "int4", 32)])
    with pytest.raises(ValueError, match="one format, group"):
        LowBitLinear.stack([a, LowBitLinear(_linear(16, 256, torch.float32, "cpu"), "int8")])
    whole = LowBitLinear.stack([a, a])
    with pytest.raises(ValueError, match="not a block"):
        LowBitRows(whole, 8, 40)
    first, second = LowBitRows(whole, 0, 16), LowBitRows(whole, 16, 32)
    assert stacked_whole([first, second]) is whole
    assert stacked_whole([second, first]) is None and stacked_whole([first]) is None  # order, whole span
    assert stacked_whole([a, second]) is None


@needs_cuda
@pytest.mark.parametrize("rows", [1, 5])
def test_stacked_tinygemm_layer_computes_its_parts(rows):
    """The same in tinygemm's layout, whose packed weight holds output channels in tiles of 8."""
    layers, whole, parts = _stack_case("int4", 128, "cuda", torch.bfloat16)
    assert {m.layout for m in layers} == {"tinygemm"} == {whole.layout}
    x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    _check_stack(layers, whole, parts, x, 2e-2)
