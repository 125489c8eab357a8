"""Weight-only low-bit formats for draft weights (issue 39): int8 per output channel, int4 per group of input
channels, symmetric. The plain PyTorch reference (`naive`: quantize, dequantize, pack, the linear it computes) and
``hsv::low_bit_linear`` (`op`), the weight-only matmul for draft steps: a Triton kernel (`kernel`) for up to
`MAX_ROWS` token rows, the reference elsewhere."""

from .naive import (
    LOW_BIT_FORMATS,
    dequantize,
    fake_quantize,
    low_bit_linear_naive,
    pack,
    quantize,
    quantized_bytes,
    unpack,
)
from .op import MAX_ROWS, low_bit_linear

__all__ = [
    "LOW_BIT_FORMATS",
    "MAX_ROWS",
    "dequantize",
    "fake_quantize",
    "low_bit_linear",
    "low_bit_linear_naive",
    "pack",
    "quantize",
    "quantized_bytes",
    "unpack",
]
