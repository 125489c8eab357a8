"""`LowBitLinear`: a linear layer whose weight is stored in int8 or packed int4 and applied by a weight-only
low-bit matmul (`hf_sparse_verify.kernels.low_bit`). The layers of a low-bit draft copy
(`hf_sparse_verify.generation.drafters.low_bit.low_bit_copy`); `FusedQKVAttention` takes them as projections."""

from __future__ import annotations

import torch

from ..kernels.low_bit import dequantize, low_bit_linear, pack, quantize, unpack
from ..kernels.low_bit.tinygemm import tinygemm_fits, tinygemm_linear, tinygemm_pack, tinygemm_values

#: where the stored weight is laid out for: ``"packed"`` our layout (`kernels.low_bit.naive.pack`; the Triton
#: kernel, or the reference), ``"tinygemm"`` PyTorch's int4 kernel on CUDA (`kernels.low_bit.tinygemm`)
LAYOUTS = ("auto", "packed", "tinygemm")


class LowBitLinear(torch.nn.Module):
    """A linear layer whose weight is stored in ``fmt`` (``"int8"`` per output channel, ``"int4"`` per group of
    ``group_size`` input channels) and applied by a weight-only low-bit matmul; its bias (if any) is the
    original's.

    Args:
        linear: the ``nn.Linear`` to round (left as it is).
        fmt: ``"int8"`` or ``"int4"``.
        group_size: input channels per int4 scale.
        layout: ``"auto"`` (default): ``"tinygemm"`` for an int4 bf16 layer on a CUDA device where PyTorch's int4
            kernel takes its shape (`tinygemm_fits`; its scales are rounded to bf16), else ``"packed"``
            (``hsv::low_bit_linear``, our Triton kernel or its reference).
    """

    def __init__(self, linear: torch.nn.Linear, fmt: str, group_size: int = 128, layout: str = "auto"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        weight = linear.weight
        fits = fmt == "int4" and tinygemm_fits(*weight.shape, group_size, weight.device, weight.dtype)
        if layout == "tinygemm" and not fits:
            raise ValueError(
                f"tinygemm takes int4 bf16 layers on CUDA with out % 8 == 0, in % 32 == 0 and groups of 32-256: "
                f"this one is {fmt}, {weight.dtype}, {tuple(weight.shape)} on {weight.device}, group {group_size}; "
                "use layout='packed'"
            )
        self.layout = "tinygemm" if layout == "tinygemm" or (layout == "auto" and fits) else "packed"
        values, scales = quantize(weight, fmt, group_size)
        if self.layout == "tinygemm":
            stored, scales = tinygemm_pack(values, scales, group_size)
        else:
            stored = pack(values, fmt).to(weight.device)
        self.register_buffer("stored", stored)
        self.register_buffer("scales", scales.to(weight.device))
        self.bias = linear.bias
        self.fmt, self.group_size = fmt, group_size
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "tinygemm":
            return tinygemm_linear(x, self.stored, self.scales, self.group_size, self.bias)
        return low_bit_linear(x, self.stored, self.scales, self.fmt, self.group_size, self.bias)

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        """The ``[out, in]`` weight the layer applies (in ``dtype``; the tinygemm layout reads it back through
        its kernel)."""
        if self.layout == "tinygemm":
            values, scales = tinygemm_values(self.stored, self.scales, self.group_size, self.in_features)
            return dequantize(values, scales, self.fmt, dtype)
        return dequantize(unpack(self.stored, self.fmt), self.scales, self.fmt, dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}, "
            f"group {self.group_size}, {self.layout}"
        )
