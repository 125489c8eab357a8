"""CUDA kernel time per step from a `torch.profiler` run, grouped by kernel name (the diagnostic scripts'
common table)."""

from __future__ import annotations

import torch


def kernel_rows(prof, steps: int, name_chars: int = 90) -> list[dict]:
    """The CUDA kernels of ``prof`` (a finished ``torch.profiler.profile`` over ``steps`` steps) grouped by name,
    largest first: ``kernel`` (the name cut to ``name_chars``), ``calls_per_step`` and ``us_per_step``."""
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time)
    rows = (
        {"kernel": k[:name_chars], "calls_per_step": len(v) / steps, "us_per_step": sum(v) / steps}
        for k, v in kernels.items()
    )
    return sorted(rows, key=lambda r: -r["us_per_step"])
