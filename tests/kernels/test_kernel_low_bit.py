"""Low-bit weight formats (the reference): rounding error bounds, layout, bytes, clear errors."""

from __future__ import annotations

import doctest

import pytest
import torch

import hf_sparse_verify.kernels.low_bit.naive as naive
from hf_sparse_verify.kernels.low_bit import dequantize, fake_quantize, quantize, quantized_bytes


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
