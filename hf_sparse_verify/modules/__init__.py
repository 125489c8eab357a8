"""Module replacement for the fast path: swap known transformers modules for fused-kernel equivalents for the
duration of a call, log it, and put the originals back on exit (also on errors).

Only modules whose ``forward`` arithmetic we have checked are replaced (`REPLACEABLE`); each replacement reads the
attributes it declares and holds no state of its own.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from .rms_norm import REPLACEABLE, TritonRMSNorm

logger = logging.getLogger(__name__)

__all__ = ["REPLACEABLE", "TritonRMSNorm", "use_fused_modules"]


@contextlib.contextmanager
def use_fused_modules(*models: torch.nn.Module) -> Iterator[int]:
    """Within the block, every RMSNorm of ``models`` whose class is in `REPLACEABLE` is a `TritonRMSNorm` sharing
    its weight; yields how many modules were replaced."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    try:
        for model in models:
            for parent in list(model.modules()):
                for name, child in list(parent.named_children()):
                    if type(child).__name__ in REPLACEABLE:
                        setattr(parent, name, TritonRMSNorm(child))
                        swapped.append((parent, name, child))
        if swapped:
            logger.info("hf_sparse_verify: %d RMSNorm modules run the fused Triton kernel", len(swapped))
        yield len(swapped)
    finally:
        for parent, name, child in reversed(swapped):
            setattr(parent, name, child)
