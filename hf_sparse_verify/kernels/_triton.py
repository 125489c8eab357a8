"""What every kernel folder needs from Triton: whether Triton can run on a tensor's device, and launches on the
device of their tensors."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - triton is a Linux dependency of the package
    HAVE_TRITON = False

T = TypeVar("T")


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


def on_input_device(launch: Callable[..., T]) -> Callable[..., T]:
    """Decorates a kernel-launch function so that the device of its first tensor argument (positional, else keyword)
    is the current CUDA device while it runs. Triton launches on the *current* device; under an accelerate device
    map a layer on GPU 1 hands its kernels GPU 1 tensors while GPU 0 is current, which is an illegal memory access.
    No cost beyond one device query when the device is already current (always, on one GPU)."""

    @functools.wraps(launch)
    def run(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if (
            first is not None
            and first.device.type == "cuda"
            and first.device.index != torch.cuda.current_device()
        ):
            with torch.cuda.device(first.device):
                return launch(*args, **kwargs)
        return launch(*args, **kwargs)

    return run


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def dot_in_float32(dtype: torch.dtype) -> bool:
    """Whether kernels must upcast ``tl.dot`` operands to float32: Triton's CPU interpreter (3.9) computes bf16
    dots wrongly (it reads the raw 16-bit patterns), so interpreted bf16 runs upcast; compiled runs never do."""
    return interpreting() and dtype == torch.bfloat16


def dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """``(upcast, input_precision)`` for a kernel's ``tl.dot`` on ``dtype`` operands: whether to upcast them to
    float32 (`dot_in_float32`), and ``"ieee"`` where the dot then runs on float32 operands (exact, as the references
    compute), ``"tf32"`` otherwise (where it changes nothing for 16-bit operands)."""
    upcast = dot_in_float32(dtype)
    return upcast, "ieee" if dtype == torch.float32 or upcast else "tf32"


# ---- programmatic dependent launch ---------------------------------------------------------------------------------
# On Hopper and newer, a kernel launched with PDL may be scheduled while the kernel before it on the stream is still
# running; it waits inside (``griddepcontrol.wait``) for that kernel to finish and flush its writes. The launch and
# the first instructions of each kernel then overlap the tail of the previous one, inside CUDA graphs too. Measured
# on an H200 (graph of 48 one-program RMSNorms: 1.16-1.34 against 1.01 us per kernel; `benchmarks/bench_pdl.py`,
# `benchmarks/results/pdl.json`).

_PDL = {"enabled": os.environ.get("HF_SPARSE_VERIFY_PDL", "1") not in ("", "0")}


def set_pdl(enabled: bool) -> bool:
    """Turns programmatic dependent launch on or off for launches from now on and returns the previous setting
    (benchmarks compare the two; graphs captured before keep what they were captured with: clear the graph cache
    after switching). The default is on, or what ``HF_SPARSE_VERIFY_PDL`` (``0`` / ``1``) says at import."""
    previous = _PDL["enabled"]
    _PDL["enabled"] = bool(enabled)
    return previous


@functools.cache
def _hopper_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_on(device: torch.device) -> bool:
    """Whether kernels for tensors on ``device`` launch with PDL: compiled Triton on a CUDA device of compute
    capability 9.0 or newer, unless switched off (`set_pdl`)."""
    if not _PDL["enabled"] or device.type != "cuda" or not triton_runs_on(device):
        return False
    return _hopper_or_newer(device.index if device.index is not None else torch.cuda.current_device())


def pdl_launch(device: torch.device) -> dict:
    """Keyword arguments for a launch of a kernel that starts with `pdl_wait`: its ``PDL`` constexpr and, when on,
    Triton's ``launch_pdl``."""
    return {"PDL": True, "launch_pdl": True} if pdl_on(device) else {"PDL": False}


if HAVE_TRITON:

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """The first statement of every kernel of this package: under PDL, wait until the previous kernel on the
        stream has finished and its writes are visible, then let the next kernel launch. Nothing of the kernel may
        read or write global memory before it (the previous kernel may still be reading buffers this one writes)."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def online_softmax_block(b_s, b_m, b_l):
        """One block of base-2 logits ``b_s`` ``[M, N]`` (``-inf`` where not attended) folded into a flash-attention
        row state, its running max ``b_m`` and sum ``b_l`` ``[M]``. Returns ``(b_p, alpha, m_new, l_new)``: the
        block's unnormalised probabilities, the factor that rescales the accumulator, the new max and sum. A row
        with nothing attended yet keeps max ``-inf`` and sum 0."""
        m_new = tl.maximum(b_m, tl.max(b_s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(b_m - m_safe)
        b_p = tl.exp2(b_s - m_safe[:, None])
        return b_p, alpha, m_new, b_l * alpha + tl.sum(b_p, axis=1)

    @triton.jit
    def merge_splits(b_po, b_lse):
        """The normalised outputs of one row's splits ``b_po`` ``[S, D]`` merged by their base-2 log-sum-exps
        ``b_lse`` ``[S]`` (``-inf`` for a split that attended nothing): ``[D]``, zeros if none attended."""
        top = tl.max(b_lse, axis=0)
        w = tl.exp2(b_lse - tl.where(top == float("-inf"), 0.0, top))
        total = tl.sum(w, axis=0)
        return tl.sum(b_po * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
