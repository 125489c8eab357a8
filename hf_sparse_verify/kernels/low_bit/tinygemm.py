"""Our int4 format through PyTorch's int4 weight-only matmul on CUDA (tinygemm: ``aten._convert_weight_to_int4pack``
and ``aten._weight_int4pack_mm``, the kernel torchao's int4 weight-only config runs).

Why a library kernel: on an H100 with the weights out of L2 (``benchmarks/results/low_bit_linear_cold.json``), one 8B
layer at one row took 77 us with tinygemm against 107 us with our Triton int4 kernel (0.59 against 0.41 of the
copy bandwidth); GemLite's int4 kernel was off the reference by 2.8-5% at one row. So int4 layers on CUDA use
tinygemm where it fits (`tinygemm_fits`), and our kernel (`kernel`) everywhere else.

The format maps exactly: our value ``v`` in [-8, 7] is tinygemm's ``q = v + 8`` with zero point 0, so its
``(q - 8) * scale + zero`` is ``v * scale``, the weight `naive.dequantize` gives in bf16, once the scales are
rounded to bf16 (`tinygemm_pack` rounds them; the weight the layer applies is that one). tinygemm takes bf16
activations only, ``out`` a multiple of 8, ``in`` a multiple of 32 and groups of 32, 64, 128 or 256 channels.

Example (CUDA only):
    >>> w = torch.randn(64, 256, device="cuda")  # doctest: +SKIP
    >>> values, scales = quantize(w, "int4", 64)  # doctest: +SKIP
    >>> packed, scales_zeros = tinygemm_pack(values, scales, 64)  # doctest: +SKIP
    >>> x = torch.randn(3, 256, device="cuda", dtype=torch.bfloat16)  # doctest: +SKIP
    >>> tinygemm_linear(x, packed, scales_zeros, 64).shape  # doctest: +SKIP
    torch.Size([3, 64])
"""

from __future__ import annotations

import torch

#: the group sizes tinygemm takes
TINYGEMM_GROUPS = (32, 64, 128, 256)
#: input channels per tinygemm k-tile
_K_TILE = 16


def _inner_k_tiles(in_features: int) -> int:
    """The largest of tinygemm's k-tile counts (8, 4, 2) whose span divides ``in_features``."""
    return next(tiles for tiles in (8, 4, 2) if in_features % (tiles * _K_TILE) == 0)


def tinygemm_fits(out_features: int, in_features: int, group_size: int, device: torch.device, dtype) -> bool:
    """Whether tinygemm runs an int4 layer of this shape and group for ``dtype`` activations on ``device``."""
    return (
        torch.device(device).type == "cuda"
        and dtype == torch.bfloat16
        and torch.cuda.get_device_capability(device) >= (8, 0)
        and group_size in TINYGEMM_GROUPS
        and in_features % group_size == 0
        and in_features % (2 * _K_TILE) == 0
        and out_features % 8 == 0
    )


def tinygemm_pack(values: torch.Tensor, scales: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tinygemm's operands for `naive.quantize`'s int4 ``values`` ``[out, in]`` and float32 ``scales``
    ``[out, in / group_size]`` (on the CUDA device the layer runs on): the packed int32 weight and the bf16
    ``[in / group_size, out, 2]`` scales and zero points (zero 0)."""
    q = (values.to(torch.int32) + 8).to(torch.uint8)  # [out, in], 0 .. 15
    packed = torch.ops.aten._convert_weight_to_int4pack(q[:, ::2] << 4 | q[:, 1::2], _inner_k_tiles(values.shape[1]))
    scale = scales.t().to(torch.bfloat16)  # [groups, out]
    return packed, torch.stack([scale, torch.zeros_like(scale)], dim=-1).contiguous()


def tinygemm_linear(
    x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``x`` ``[..., in]`` (bf16) times the weight `tinygemm_pack`'s operands stand for, plus ``bias``:
    ``[..., out]``."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"tinygemm takes bf16 activations, got {x.dtype}: run the model in bf16")
    lead, n_in = x.shape[:-1], x.shape[-1]
    out = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, n_in).contiguous(), packed, group_size, scales_zeros)
    if bias is not None:
        out = out + bias
    return out.view(*lead, scales_zeros.shape[1])


def tinygemm_values(packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int, in_features: int):
    """`tinygemm_pack`'s inverse: ``(values int8 [out, in], scales float32 [out, groups])``, read back through the
    kernel itself (an identity input, in blocks of 1,024 channels): what the layer applies, not what it was built
    from. For tests and inspection; the cost is one matmul per block."""
    scales = scales_zeros[..., 0].t().float()  # [out, groups]
    columns = []
    for start in range(0, in_features, 1024):
        stop = min(start + 1024, in_features)
        eye = torch.zeros(stop - start, in_features, dtype=torch.bfloat16, device=packed.device)
        eye[:, start:stop] = torch.eye(stop - start, dtype=torch.bfloat16, device=packed.device)
        columns.append(torch.ops.aten._weight_int4pack_mm(eye, packed, group_size, scales_zeros).t())
    weight = torch.cat(columns, dim=1).float()  # [out, in], each v * scale rounded to bf16
    per_group = scales.repeat_interleave(group_size, dim=1)
    values = torch.round(weight / per_group).clamp(-8, 7)
    return values.to(torch.int8), scales
