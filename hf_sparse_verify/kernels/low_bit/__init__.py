"""Weight-only low-bit formats for draft weights (issue 39): int8 per output channel, int4 per group of input
channels, symmetric. Only the plain PyTorch reference so far (quantize, dequantize); the weight-only matmul kernel
for the draft shapes is not built yet."""

from .naive import LOW_BIT_FORMATS, dequantize, fake_quantize, quantize, quantized_bytes

__all__ = ["LOW_BIT_FORMATS", "dequantize", "fake_quantize", "quantize", "quantized_bytes"]
