"""``prompt_lookup``: n-gram drafting from the row's own history (prompt and output), batched.

For every active row, the last ``n`` tokens (``n`` from ``max_ngram`` down to ``min_ngram``) are searched in the
row's earlier history; the tokens that followed the most recent earlier occurrence become the draft. The search
runs on the host copy of the history (numpy), so it costs no device synchronisation; rows with no match propose
nothing. Gives no probabilities: sampling verification then samples from the target at every position.
"""

from __future__ import annotations

import numpy as np
import torch

from ..state import DecodeState
from .base import Draft, Drafter


def lookup_ngram(history: np.ndarray, num_tokens: int, max_ngram: int, min_ngram: int) -> np.ndarray:
    """Continuation of the most recent earlier occurrence of the history's trailing n-gram that is followed by
    ``num_tokens`` tokens (else of the earliest occurrence, which has the longest continuation).

    Args:
        history: 1-D int array (no padding).
        num_tokens: most tokens to return.
        max_ngram, min_ngram: n-gram sizes tried, longest first.

    Returns:
        up to ``num_tokens`` tokens (empty when no n-gram recurs).

    Example:
        >>> lookup_ngram(np.array([5, 6, 7, 8, 5, 6]), 3, 2, 1).tolist()
        [7, 8, 5]
    """
    length = history.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = history[length - n :]
        windows = np.lib.stride_tricks.sliding_window_view(history[: length - 1], n)  # starts 0 .. length-1-n
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            full = hits[hits + n + num_tokens <= length]
            start = int(full[-1] if full.size else hits[0]) + n
            return history[start : start + num_tokens]
    return history[:0]


class PromptLookupDrafter(Drafter):
    """Batched prompt-lookup (n-gram) drafter."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @classmethod
    def from_config(cls, config, **_) -> PromptLookupDrafter:
        return cls(config.prompt_lookup_max_ngram, config.prompt_lookup_min_ngram)

    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        host = state.host_tokens.numpy()
        drafts = np.zeros((state.batch_size, num_tokens), dtype=np.int64)
        counts = [0] * state.batch_size
        for row in range(state.batch_size):
            if not state.active[row]:
                continue
            found = lookup_ngram(
                host[row, state.pad[row] : state.committed[row]], num_tokens, self.max_ngram, self.min_ngram
            )
            drafts[row, : found.size] = found
            counts[row] = int(found.size)
        tokens = torch.from_numpy(drafts).to(state.tokens.device, non_blocking=True)
        return Draft(tokens, counts, None)
