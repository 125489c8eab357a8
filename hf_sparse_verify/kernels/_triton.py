"""What every kernel folder needs from Triton: whether Triton can run on a tensor's device."""

from __future__ import annotations

import functools
import os

import torch

try:
    import triton  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux dependency of the package
    HAVE_TRITON = False


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of ``device``: compiled on CUDA, interpreted on CPU."""
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return not interpreting()
    return device.type == "cpu" and interpreting()


def compiled_on(device: torch.device) -> bool:
    """Whether compiled (not interpreted) Triton kernels run on ``device``: a CUDA device outside the interpreter.
    The fused module replacements take their kernel paths only there; elsewhere they compute transformers'
    arithmetic."""
    return device.type == "cuda" and triton_runs_on(device)


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA ``device`` (cached; no synchronisation), None on other devices: the
    caller picks its own figure there."""
    if device.type != "cuda":
        return None
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def dot_in_float32(dtype: torch.dtype) -> bool:
    """Whether kernels must upcast ``tl.dot`` operands to float32: Triton's CPU interpreter (3.9) computes bf16
    dots wrongly (it reads the raw 16-bit patterns), so interpreted bf16 runs upcast; compiled runs never do."""
    return interpreting() and dtype == torch.bfloat16
