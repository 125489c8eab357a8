"""Benchmark registry: each kernel folder's ``bench.py`` registers a function that yields `KernelCase` objects
(a launch to time plus the fewest bytes it must move); ``benchmarks/bench_kernels.py`` times every case against
the measured copy bandwidth.

Example:
    >>> from hf_sparse_verify.kernels.bench_registry import BENCHMARKS, register_benchmark
    >>> @register_benchmark("example")
    ... def cases(device, dtype, quick):
    ...     yield from ()
    >>> "example" in BENCHMARKS
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class KernelCase:
    """One timed launch.

    Attributes:
        op: registry name of the op (``"decode_attention"``).
        variant: which implementation or mode (``"triton"``, ``"triton+scores"``, ``"sdpa"``).
        params: the sizes, for the JSON record (``{"context": 65536, "q_len": 4, ...}``).
        bytes_moved: the fewest bytes the launch must read and write (inputs read once, outputs written once).
        run: the launch; called repeatedly by the benchmark.
    """

    op: str
    variant: str
    params: dict
    bytes_moved: int
    run: Callable[[], object] = field(repr=False)


#: op name -> ``fn(device: torch.device, dtype: torch.dtype, quick: bool) -> Iterator[KernelCase]``
BENCHMARKS: dict[str, Callable[[torch.device, torch.dtype, bool], Iterator[KernelCase]]] = {}

#: the kernel folders whose ``bench.py`` registers an entry (imported by `load_all`)
BENCH_MODULES = (
    "hf_sparse_verify.kernels.decode_attention.bench",
    "hf_sparse_verify.kernels.token_sparse.bench",
    "hf_sparse_verify.kernels.block_sparse.bench",
    "hf_sparse_verify.kernels.block_summary.bench",
    "hf_sparse_verify.kernels.rms_norm.bench",
    "hf_sparse_verify.kernels.cache_write.bench",
    "hf_sparse_verify.kernels.fused_experts.bench",
    "hf_sparse_verify.kernels.sparse_ffn.bench",
    "hf_sparse_verify.kernels.qkv_rope.bench",
    "hf_sparse_verify.kernels.moe_router.bench",
    "hf_sparse_verify.kernels.expert_skip.bench",
    "hf_sparse_verify.kernels.topk_slots.bench",
    "hf_sparse_verify.kernels.ngram_lookup.bench",
    "hf_sparse_verify.kernels.gated_delta.bench",
    "hf_sparse_verify.kernels.index_scores.bench",
)


def register_benchmark(name: str):
    """Decorator: register ``fn(device, dtype, quick)`` yielding `KernelCase` under ``name``."""

    def add(fn):
        BENCHMARKS[name] = fn
        return fn

    return add


def load_all() -> dict:
    """Import every kernel folder's ``bench.py`` (registering its entry) and return `BENCHMARKS`."""
    for module in BENCH_MODULES:
        importlib.import_module(module)
    return BENCHMARKS
