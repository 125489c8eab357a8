"""Public n-gram search of prompt lookup.

- `ngram_lookup`: the function, registered as ``hsv::ngram_lookup`` (opaque to graph capture and compile), fresh
  outputs per call: the Triton kernel where it runs, the PyTorch reference elsewhere.
- `NgramLookup`: the same search prepared for one batch, history width and K, for a decode loop: inputs checked
  once (`NgramLookup.check`), outputs and scratch kept, each call one launch with nothing else on the host.
"""

from __future__ import annotations

import torch

from .._triton import compiled_on
from .naive import ngram_lookup_naive


@torch.library.custom_op("hsv::ngram_lookup", mutates_args=())
def _ngram_lookup_op(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    active: torch.Tensor | None,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    kernel: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if kernel:
        from .kernel import ngram_lookup_triton

        return ngram_lookup_triton(tokens, committed, pad, num_tokens, max_ngram, min_ngram, active)
    drafts, counts = ngram_lookup_naive(tokens, committed, pad, num_tokens, max_ngram, min_ngram, active)
    return drafts.contiguous(), counts


@_ngram_lookup_op.register_fake
def _(tokens, committed, pad, active, num_tokens, max_ngram, min_ngram, kernel):
    batch = tokens.shape[0]
    return tokens.new_empty(batch, num_tokens), tokens.new_empty(batch, dtype=torch.int64)


def _check_sizes(num_tokens: int, max_ngram: int, min_ngram: int) -> None:
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")


def _check_inputs(
    tokens: torch.Tensor, committed: torch.Tensor, pad: torch.Tensor, active: torch.Tensor | None
) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"tokens must be int64 [B, C], got {tokens.dtype} {tuple(tokens.shape)}")
    rows = [("committed", committed, torch.int64), ("pad", pad, torch.int64)]
    if active is not None:
        rows.append(("active", active, torch.bool))
    for name, t, dtype in rows:
        if t.shape != (tokens.shape[0],) or t.dtype != dtype or t.device != tokens.device:
            kind = str(dtype).removeprefix("torch.")
            raise ValueError(
                f"{name} must be {kind} [B] = [{tokens.shape[0]}] on {tokens.device}, got {t.dtype} "
                f"{tuple(t.shape)} on {t.device}"
            )


def ngram_lookup(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    kernel: bool | None = None,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt lookup's draft for every row at once (see `ngram_lookup_naive` for the rule), no host sync.

    Args:
        tokens: ``[B, C]`` int64 histories; row ``b`` holds its history in ``[pad[b], committed[b])``.
        committed, pad: ``[B]`` int64 on the device of ``tokens``.
        num_tokens: most draft tokens per row (>= 0).
        max_ngram, min_ngram: n-gram sizes tried, longest first (``1 <= min_ngram <= max_ngram``).
        kernel: run the Triton kernel; default: where it runs compiled (CUDA). The CPU interpreter runs it only
            when asked (``kernel=True``, the kernel's tests): interpreted, it is far slower than the reference.
        active: ``[B]`` bool, rows that draft (the others get count 0); default: every row.

    Returns:
        ``drafts [B, num_tokens]`` (positions past a row's count hold stale tokens) and ``counts [B]`` int64.

    Example:
        >>> t = torch.tensor([[0, 5, 6, 7, 8, 5, 6]])
        >>> d, c = ngram_lookup(t, torch.tensor([7]), torch.tensor([1]), 3, 2, 1, kernel=False)
        >>> d.tolist(), c.tolist()
        ([[7, 8, 5]], [3])
    """
    _check_inputs(tokens, committed, pad, active)
    _check_sizes(num_tokens, max_ngram, min_ngram)
    if kernel is None:
        kernel = compiled_on(tokens.device)
    return _ngram_lookup_op(
        tokens.contiguous(), committed, pad, active, int(num_tokens), max_ngram, min_ngram, kernel
    )


class NgramLookup:
    """`ngram_lookup` prepared for ``batch`` rows of ``capacity`` slots and ``num_tokens`` drafts: the outputs and
    the kernel's scratch are allocated here, inputs are checked by `check` (once per set of input tensors, not per
    call), and a call is one launch (the Triton kernel) or the reference's launches (``kernel=False``).

    A call's outputs are the same two tensors every time: the next call overwrites them, in stream order. Launch
    calls of one object on one stream only (the scratch is shared by its launches).

    Example:
        >>> t = torch.tensor([[0, 5, 6, 7, 8, 5, 6]])
        >>> search = NgramLookup(1, 7, 3, 2, 1, t.device, kernel=False)
        >>> committed, pad, active = torch.tensor([7]), torch.tensor([1]), torch.tensor([True])
        >>> search.check(t, committed, pad, active)
        >>> d, c = search(t, committed, pad, active)
        >>> d.tolist(), c.tolist()
        ([[7, 8, 5]], [3])
    """

    def __init__(
        self,
        batch: int,
        capacity: int,
        num_tokens: int,
        max_ngram: int,
        min_ngram: int,
        device: torch.device,
        kernel: bool | None = None,
    ):
        _check_sizes(num_tokens, max_ngram, min_ngram)
        self.shape = (batch, capacity)
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram
        self.kernel = compiled_on(device) if kernel is None else kernel
        self.drafts = torch.empty(batch, num_tokens, dtype=torch.int64, device=device)  # [B, K]
        self.counts = torch.zeros(batch, dtype=torch.int64, device=device)  # [B]
        self.scratch = None
        self._launch = None
        if self.kernel and batch > 0 and num_tokens > 0 and capacity > 0:
            from .kernel import launch_ngram_lookup, new_scratch

            self.scratch = new_scratch(batch, max_ngram, min_ngram, device)
            self._launch = launch_ngram_lookup

    def check(
        self, tokens: torch.Tensor, committed: torch.Tensor, pad: torch.Tensor, active: torch.Tensor | None
    ) -> None:
        """Raises ValueError unless the inputs fit this search: ``tokens`` contiguous int64 ``[batch, capacity]``
        on its device, ``committed``, ``pad`` ``[batch]`` int64 and ``active`` ``[batch]`` bool (or None) beside."""
        _check_inputs(tokens, committed, pad, active)
        if (
            tuple(tokens.shape) != self.shape
            or tokens.device != self.counts.device
            or not tokens.is_contiguous()
        ):
            raise ValueError(
                f"tokens must be contiguous [{self.shape[0]}, {self.shape[1]}] on {self.counts.device} for this "
                f"search, got {tuple(tokens.shape)} on {tokens.device}; prepare an NgramLookup for that shape"
            )

    def __call__(
        self,
        tokens: torch.Tensor,
        committed: torch.Tensor,
        pad: torch.Tensor,
        active: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``drafts [B, K]`` and ``counts [B]`` of ``tokens`` (inputs as `ngram_lookup` takes them, already
        `check`-ed: nothing is checked here)."""
        if self._launch is not None:
            self._launch(
                tokens, committed, pad, active, self.drafts, self.counts, self.scratch,
                self.max_ngram, self.min_ngram,
            )  # fmt: skip
            return self.drafts, self.counts
        if not self.kernel:
            return ngram_lookup_naive(
                tokens, committed, pad, self.num_tokens, self.max_ngram, self.min_ngram, active
            )
        return self.drafts, self.counts  # nothing to search: no rows, no slots or K = 0 (counts stay 0)
