"""`LowBitLinear`: a linear layer whose weight is stored in int8 or packed int4 and applied by the weight-only
low-bit matmul (`hf_sparse_verify.kernels.low_bit`). The layers of a low-bit draft copy
(`hf_sparse_verify.generation.drafters.low_bit.low_bit_copy`); `FusedQKVAttention` takes them as projections."""

from __future__ import annotations

import torch

from ..kernels.low_bit import dequantize, low_bit_linear, pack, quantize, unpack


class LowBitLinear(torch.nn.Module):
    """A linear layer whose weight is stored in ``fmt`` (``"int8"`` per output channel, ``"int4"`` per group of
    ``group_size`` input channels, packed two per byte) and applied by ``hsv::low_bit_linear``; its bias (if any)
    is the original's.

    Args:
        linear: the ``nn.Linear`` to round (left as it is).
        fmt: ``"int8"`` or ``"int4"``.
        group_size: input channels per int4 scale.
    """

    def __init__(self, linear: torch.nn.Linear, fmt: str, group_size: int = 128):
        super().__init__()
        values, scales = quantize(linear.weight, fmt, group_size)
        self.register_buffer("stored", pack(values, fmt).to(linear.weight.device))
        self.register_buffer("scales", scales.to(linear.weight.device))
        self.bias = linear.bias
        self.fmt, self.group_size = fmt, group_size
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return low_bit_linear(x, self.stored, self.scales, self.fmt, self.group_size, self.bias)

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        """The ``[out, in]`` weight the layer applies."""
        return dequantize(unpack(self.stored, self.fmt), self.scales, self.fmt, dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}, group {self.group_size}"
