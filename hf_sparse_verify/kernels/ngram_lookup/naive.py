"""Reference: prompt lookup's n-gram search for every row at once, in plain PyTorch (imports only torch)."""

from __future__ import annotations

import torch


def ngram_lookup_naive(
    tokens: torch.Tensor,
    committed: torch.Tensor,
    pad: torch.Tensor,
    num_tokens: int,
    max_ngram: int,
    min_ngram: int,
    active: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the continuation of its trailing n-gram's most recent earlier occurrence that is followed by
    ``num_tokens`` tokens (else of its earliest occurrence, which has the longest continuation), longest ``n``
    first, from ``max_ngram`` down to ``min_ngram``.

    Args:
        tokens: ``[B, C]`` int64 histories; row ``b`` holds its history in ``[pad[b], committed[b])``
            (``0 <= pad[b]``, ``committed[b] <= C``).
        committed, pad: ``[B]`` int64.
        num_tokens: most draft tokens per row.
        active: ``[B]`` bool, rows that draft; the others get count 0 (default: every row drafts).

    Returns:
        ``drafts [B, num_tokens]`` (positions past a row's count hold stale tokens) and ``counts [B]`` int64.

    Example:
        >>> t = torch.tensor([[0, 5, 6, 7, 8, 5, 6]])
        >>> d, c = ngram_lookup_naive(t, torch.tensor([7]), torch.tensor([1]), 3, 2, 1)
        >>> d.tolist(), c.tolist()
        ([[7, 8, 5]], [3])
    """
    batch, capacity = tokens.shape
    device = tokens.device
    source = torch.full((batch,), -1, dtype=torch.long, device=device)  # first slot of the continuation
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= capacity:
            continue
        pattern = tokens.gather(1, (committed[:, None] - n + torch.arange(n, device=device)).clamp_min(0))
        windows = tokens.unfold(1, n, 1)  # [B, P, n]: window p covers slots p .. p + n - 1
        p = torch.arange(windows.shape[1], device=device)[None, :]
        hit = (windows == pattern[:, None, :]).all(dim=-1)
        hit &= (p >= pad[:, None]) & (p + n <= committed[:, None] - 1)  # earlier occurrences only
        full = hit & (p + n + num_tokens <= committed[:, None])
        latest_full = torch.where(full, p, -1).amax(dim=1)
        earliest = torch.where(hit, p, capacity).amin(dim=1)
        start = torch.where(latest_full >= 0, latest_full, torch.where(earliest < capacity, earliest, -1))
        source = torch.where((source < 0) & (start >= 0), start + n, source)
    found = source >= 0
    if active is not None:
        found &= active
    counts = torch.where(found, (committed - source).clamp(max=num_tokens), 0)
    slots = (source.clamp_min(0)[:, None] + torch.arange(num_tokens, device=device)).clamp_max(capacity - 1)
    return tokens.gather(1, slots), counts
