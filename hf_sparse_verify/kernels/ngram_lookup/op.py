"""Public n-gram search of prompt lookup, registered as ``hsv::ngram_lookup`` (opaque to graph capture and
compile): the Triton kernel where it runs, the PyTorch reference elsewhere."""

from __future__ import annotations

import torch

from .._triton import compiled_on
from .naive import ngram_lookup_naive


@torch.library.custom_op("hsv::ngram_lookup", mutates_args=())
def _ngram_lookup_op(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel:
        from .kernel import ngram_lookup_triton

        return ngram_lookup_triton(tokens, committed, pad, num_tokens, max_ngram, min_ngram)
    drafts, counts = ngram_lookup_naive(tokens, committed, pad, num_tokens, max_ngram, min_ngram)
    return drafts.contiguous(), counts


@_ngram_lookup_op.register_fake
def _(tokens, committed, pad, num_tokens, max_ngram, min_ngram, kernel):
    batch = tokens.shape[0]
    return tokens.new_empty(batch, num_tokens), tokens.new_empty(batch, dtype=torch.int64)


def ngram_lookup(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    kernel: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt lookup's draft for every row at once (see `ngram_lookup_naive` for the rule), no host sync.

    Args:
        tokens: ``[B, C]`` int64 histories; row ``b`` holds its history in ``[pad[b], committed[b])``.
        committed, pad: ``[B]`` int64 on the device of ``tokens``.
        num_tokens: most draft tokens per row (>= 0).
        max_ngram, min_ngram: n-gram sizes tried, longest first (``1 <= min_ngram <= max_ngram``).
        kernel: run the Triton kernel; default: where it runs compiled (CUDA). The CPU interpreter runs it only
            when asked (``kernel=True``, the kernel's tests): interpreted, it is far slower than the reference.

    Returns:
        ``drafts [B, num_tokens]`` (positions past a row's count hold stale tokens) and ``counts [B]`` int64.

    Example:
        >>> t = torch.tensor([[0, 5, 6, 7, 8, 5, 6]])
        >>> d, c = ngram_lookup(t, torch.tensor([7]), torch.tensor([1]), 3, 2, 1, kernel=False)
        >>> d.tolist(), c.tolist()
        ([[7, 8, 5]], [3])
    """
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64 [B, C], got {tokens.dtype} {tuple(tokens.shape)}")
    for name, t in (("committed", committed), ("pad", pad)):
        if t.shape != (tokens.shape[0],) or t.dtype != torch.int64 or t.device != tokens.device:
            raise ValueError(
                f"{name} must be int64 [B] = [{tokens.shape[0]}] on {tokens.device}, got {t.dtype} "
                f"{tuple(t.shape)} on {t.device}"
            )
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if kernel is None:
        kernel = compiled_on(tokens.device)
    return _ngram_lookup_op(
        tokens.contiguous(), committed, pad, int(num_tokens), max_ngram, min_ngram, kernel
    )
