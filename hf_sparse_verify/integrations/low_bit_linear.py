"""`LowBitLinear`: a linear layer whose weight is stored in int8 or packed int4 and applied by a weight-only
low-bit matmul (`hf_sparse_verify.kernels.low_bit`), and `LowBitRows`, a block of output rows of one that stacks
several projections (a layer's q / k / v, or gate / up: one launch where the replacement modules run them
together). The layers of a low-bit draft copy (`hf_sparse_verify.generation.drafters.low_bit.low_bit_copy`);
`FusedQKVAttention` and `LowBitGatedMLP` take them as projections."""

from __future__ import annotations

from collections.abc import Sequence

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
        rounding: how each group's scale is picked (`hf_sparse_verify.kernels.low_bit.naive.ROUNDINGS`): ``"mse"``
            (default) the scale of least squared error among candidates around ``"absmax"``'s.
    """

    #: ``(fmt, layout) -> rows``: the most rows at which the layer's matmul was measured faster than the bf16 layer
    #: it stands for (one H100, the 8B shape: whole Vegas draft steps at 16K, and single layers with weights out of
    #: L2; docs/results.md). tinygemm int4: a draft step 0.56x the model's own at 1 row, 0.74x at 4, 1.05x at 8 and
    #: 1.51x at 16; our int4 kernel: 0.61x of bf16 per decoder layer at 1 row, 1.1-1.3x slower at 8 (between them
    #: unmeasured); our int8: a draft step 0.81x at 8 rows and 0.83x at 16 (more rows not measured). What
    #: ``draft_weights="auto"`` picks by (`hf_sparse_verify.generation.drafters.low_bit.draft_weights_for`).
    FASTER_ROWS = {("int4", "tinygemm"): 4, ("int4", "packed"): 1, ("int8", "packed"): 16}

    def __init__(
        self,
        linear: torch.nn.Linear,
        fmt: str,
        group_size: int = 128,
        layout: str = "auto",
        rounding: str = "mse",
    ):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        weight = linear.weight
        self.layout = self.layout_for(linear, fmt, group_size, layout)
        values, scales = quantize(weight, fmt, group_size, rounding)
        if self.layout == "tinygemm":
            stored, scales = tinygemm_pack(values, scales, group_size)
        else:
            stored = pack(values, fmt).to(weight.device)
        self.register_buffer("stored", stored)
        self.register_buffer("scales", scales.to(weight.device))
        self.bias = linear.bias
        self.fmt, self.group_size, self.rounding = fmt, group_size, rounding
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @staticmethod
    def layout_for(linear: torch.nn.Linear, fmt: str, group_size: int, layout: str = "auto") -> str:
        """The layout ``LowBitLinear(linear, fmt, group_size, layout)`` stores its weight in (``layout="auto"``:
        tinygemm where it takes the layer), without rounding anything."""
        weight = linear.weight
        fits = fmt == "int4" and tinygemm_fits(*weight.shape, group_size, weight.device, weight.dtype)
        if layout == "tinygemm" and not fits:
            raise ValueError(
                f"tinygemm takes int4 bf16 layers on CUDA with out % 8 == 0, in % 32 == 0 and groups of 32-256: "
                f"this one is {fmt}, {weight.dtype}, {tuple(weight.shape)} on {weight.device}, group {group_size}; "
                "use layout='packed'"
            )
        return "tinygemm" if layout == "tinygemm" or (layout == "auto" and fits) else "packed"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "tinygemm":
            return tinygemm_linear(x, self.stored, self.scales, self.group_size, self.bias)
        return low_bit_linear(x, self.stored, self.scales, self.fmt, self.group_size, self.bias)

    @classmethod
    def stack(cls, layers: Sequence[LowBitLinear]) -> LowBitLinear:
        """One layer computing ``layers`` side by side (their outputs concatenated, in order): the stored weights
        and scales joined along the output channels (both layouts keep each output channel's data apart, in
        tinygemm's case in tiles of 8 channels), so it applies exactly their weights. The layers must share
        format, group, layout, rounding, input size and device; a missing bias counts as zeros."""
        first = layers[0]
        same = {(m.fmt, m.group_size, m.layout, m.rounding, m.in_features, m.stored.device) for m in layers}
        if len(same) != 1:
            raise ValueError(
                f"stacking low-bit layers needs one format, group, layout, rounding, input size and device; got {same}"
            )
        axis = 1 if first.layout == "tinygemm" else 0  # the scales' output-channel axis
        stacked = cls.__new__(cls)
        torch.nn.Module.__init__(stacked)
        stacked.register_buffer("stored", torch.cat([m.stored for m in layers]))
        stacked.register_buffer("scales", torch.cat([m.scales for m in layers], dim=axis).contiguous())
        biases = [m.bias for m in layers]
        stacked.bias = None
        if any(b is not None for b in biases):
            like = next(b for b in biases if b is not None)
            stacked.bias = torch.nn.Parameter(
                torch.cat(
                    [b if b is not None else like.new_zeros(m.out_features) for b, m in zip(biases, layers)]
                ),
                requires_grad=False,
            )
        stacked.fmt, stacked.group_size, stacked.layout = first.fmt, first.group_size, first.layout
        stacked.rounding = first.rounding
        stacked.in_features, stacked.out_features = first.in_features, sum(m.out_features for m in layers)
        return stacked

    def forward_rows(self, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Output channels ``start:stop`` of `forward` (only those rows of the weight are read)."""
        bias = self.bias[start:stop] if self.bias is not None else None
        if self.layout == "tinygemm":  # packed in tiles of 8 output channels; the scales [groups, out, 2]
            stored, scales = self.stored[start // 8 : stop // 8], self.scales[:, start:stop].contiguous()
            return tinygemm_linear(x, stored, scales, self.group_size, bias)
        return low_bit_linear(
            x, self.stored[start:stop], self.scales[start:stop], self.fmt, self.group_size, bias
        )

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
            f"group {self.group_size}, {self.layout}, {self.rounding}"
        )


class LowBitRows(torch.nn.Module):
    """Output channels ``start:stop`` of a stacked `LowBitLinear` (``whole``, see `LowBitLinear.stack`), used as one
    projection: it computes (and reads) only its rows. Modules that run all of a stack's projections together
    (`FusedQKVAttention`, `LowBitGatedMLP`) call ``whole`` once instead.

    Args:
        whole: the stacked layer (shared by the parts of the stack; a submodule of each).
        start, stop: this projection's output channels in it (multiples of 8 in the tinygemm layout).
    """

    def __init__(self, whole: LowBitLinear, start: int, stop: int):
        super().__init__()
        if not 0 <= start < stop <= whole.out_features or (
            whole.layout == "tinygemm" and (start % 8 or stop % 8)
        ):
            raise ValueError(
                f"rows {start}:{stop} are not a block of the {whole.out_features} output channels"
            )
        self.whole = whole
        self.start, self.stop = start, stop
        self.fmt, self.group_size = whole.fmt, whole.group_size
        self.layout, self.rounding = whole.layout, whole.rounding
        self.in_features, self.out_features = whole.in_features, stop - start

    @property
    def bias(self) -> torch.Tensor | None:
        return self.whole.bias[self.start : self.stop] if self.whole.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.whole.forward_rows(x, self.start, self.stop)

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        return self.whole.dequantized(dtype)[self.start : self.stop]

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.stop} of the stack"


#: the module types of a low-bit copy's projections
LOW_BIT_LAYERS = (LowBitLinear, LowBitRows)


def stacked_whole(parts: Sequence[torch.nn.Module]) -> LowBitLinear | None:
    """The stacked layer ``parts`` are, in order and together, the whole of (`LowBitRows` of one `LowBitLinear`,
    back to back from its first channel to its last), else None."""
    if not parts or not all(isinstance(p, LowBitRows) for p in parts):
        return None
    whole = parts[0].whole
    bounds = [0, *(p.stop for p in parts)]
    if (
        any(p.whole is not whole or p.start != bounds[i] for i, p in enumerate(parts))
        or bounds[-1] != whole.out_features
    ):
        return None
    return whole
