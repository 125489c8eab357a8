"""``hsv::low_bit_linear``: validation, registration with ``torch.library``, Triton where it runs (CUDA, or CPU under
``TRITON_INTERPRET=1``) for up to `MAX_ROWS` rows, the reference (`naive.low_bit_linear_naive`) elsewhere."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import LOW_BIT_FORMATS, low_bit_linear_naive

#: token rows the kernel takes (draft steps); larger inputs (a prefill) run the reference, which dequantizes the
#: weight once
MAX_ROWS = 64
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("hsv::low_bit_linear", mutates_args=())
def _low_bit_linear_op(
    x: torch.Tensor, stored: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, fmt: str,
    group_size: int,
) -> torch.Tensor:  # fmt: skip
    # int4: groups of a power of two from 32 channels (16 bytes per row, tl.dot's smallest tile)
    kernel = fmt == "int8" or (group_size >= 32 and group_size & (group_size - 1) == 0)
    if kernel and triton_runs_on(x.device) and x.dtype in _DTYPES and x.shape[0] <= MAX_ROWS:
        from .kernel import low_bit_linear_launch

        return low_bit_linear_launch(x, stored, scales, bias, fmt, group_size)
    return low_bit_linear_naive(x, stored, scales, fmt, bias).contiguous()


@_low_bit_linear_op.register_fake
def _(x, stored, scales, bias, fmt, group_size):
    return x.new_empty((x.shape[0], stored.shape[0]))


def low_bit_linear(
    x: torch.Tensor, stored: torch.Tensor, scales: torch.Tensor, fmt: str, group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``x`` ``[..., in]`` times the weight ``stored`` / ``scales`` stand for (`naive.pack`, `naive.quantize`), plus
    ``bias``: ``[..., out]`` in ``x.dtype``."""
    if fmt not in LOW_BIT_FORMATS:
        raise ValueError(f"low-bit format must be one of {sorted(LOW_BIT_FORMATS)}, got {fmt!r}")
    n_in = stored.shape[1] * (2 if fmt == "int4" else 1)
    if x.shape[-1] != n_in:
        raise ValueError(f"x has {x.shape[-1]} input channels but the weight has {n_in}")
    if scales.dtype != torch.float32 or scales.shape[0] != stored.shape[0]:
        raise ValueError("scales must be float32 [out, groups] (from quantize)")
    lead = x.shape[:-1]
    out = _low_bit_linear_op(
        x.reshape(-1, n_in).contiguous(), stored, scales.contiguous(), bias, fmt, group_size
    )
    return out.view(*lead, stored.shape[0])
