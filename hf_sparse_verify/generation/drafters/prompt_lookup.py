"""``prompt_lookup``: n-gram drafting from the row's own history (prompt and output), batched.

For every active row, the last ``n`` tokens (``n`` from ``max_ngram`` down to ``min_ngram``) are searched in the
row's earlier history; the tokens that followed the most recent earlier occurrence that has ``K`` tokens after it
(else the earliest occurrence, which has the longest continuation) become the draft. Rows with no match propose
nothing. Small batches search the host mirror of the history through an incremental n-gram index per row
(`NgramIndex`: no device work, and the loop can trim K to the longest draft); from `DEVICE_SEARCH_MIN_BATCH` rows,
and on a GPU from `DEVICE_SEARCH_MIN_PROMPT` prompt tokens, the search runs on the device, all rows at once, so
the host cost no longer grows with the batch (`hf_sparse_verify.kernels.ngram_lookup.NgramLookup`, kept per K:
one Triton launch per step where Triton runs, with inactive rows' counts zeroed inside it). Gives no
probabilities: sampling verification then samples from the target at every position.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import torch

from ...kernels.ngram_lookup import NgramLookup
from ..engine.state import DecodeState
from .base import Draft, Drafter

#: rows from which the n-gram search runs on the device (measured on an H200 with code-target: batch 32 spent
#: 0.42 s of a 128-token call searching on the host)
DEVICE_SEARCH_MIN_BATCH = 4
#: prompt tokens from which a CUDA model's search runs on the device at any batch: the host index of a 16K-token
#: prompt takes 50-100 ms to build (a 1 x 16K call on one H100 spent 0.57 ms per step drafting, 1.2x a K = 0 step),
#: the one-launch device search 0.05-0.08 ms of a step (`benchmarks/bench_ngram_lookup.py`, one H100, 1 x 16K to
#: 32 x 8K, eager, an idle GPU: `get_candidates` 45-80 us where a K = 0 step's empty draft took 21-38 us)
DEVICE_SEARCH_MIN_PROMPT = 2048
#: the device search on the Triton kernel (None: where Triton runs) or the PyTorch reference (False); benchmarks
#: switch it for A/B runs
DEVICE_SEARCH_KERNEL: bool | None = None


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


class NgramIndex:
    """One row's history with the start positions of each of its n-grams, extended as tokens are committed:
    `lookup` answers what `lookup_ngram` answers on the same history, in a dictionary lookup and a bisection
    instead of a scan of the whole history (140 us for 2.2K tokens with numpy on this project's CPU machine).

    Example:
        >>> index = NgramIndex(2, 1)
        >>> index.extend([5, 6, 7, 8, 5, 6])
        >>> index.lookup(3)
        [7, 8, 5]
    """

    def __init__(self, max_ngram: int, min_ngram: int):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.starts: dict[int, dict[tuple, list[int]]] = {n: {} for n in range(min_ngram, max_ngram + 1)}

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens and index the n-grams they complete."""
        old = len(self.tokens)
        self.tokens.extend(tokens)
        history = self.tokens
        for n, starts in self.starts.items():
            for p in range(max(0, old - n + 1), len(history) - n + 1):
                starts.setdefault(tuple(history[p : p + n]), []).append(p)

    def lookup(self, num_tokens: int) -> list[int]:
        """Up to ``num_tokens`` tokens that followed the trailing n-gram's most recent earlier occurrence with
        ``num_tokens`` tokens after it (else its earliest occurrence), longest n first; [] without one."""
        history, length = self.tokens, len(self.tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            hits = self.starts[n].get(tuple(history[length - n :]), [])
            earlier = bisect_right(hits, length - 1 - n)  # hits before the trailing n-gram itself
            if earlier:
                last_full = bisect_right(hits, length - n - num_tokens, 0, earlier) - 1
                start = hits[last_full if last_full >= 0 else 0] + n
                return history[start : start + num_tokens]
        return []


class PromptLookupDrafter(Drafter):
    """Batched prompt-lookup (n-gram) drafter."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._state: DecodeState | None = None  # the request `_indexes` belong to
        self._indexes: list[NgramIndex] = []
        self._staging: list[torch.Tensor] = []  # two pinned buffers, used in turn (see `_to_device`)
        self._searched: DecodeState | None = None  # the request whose tensors the device searches checked
        self._layout: tuple = ()  # (batch, capacity, device, kernel) of `_searches`
        self._searches: dict[tuple[str, int], NgramLookup] = {}  # (caller, K) -> the device search

    @classmethod
    def from_config(cls, config, **_) -> PromptLookupDrafter:
        return cls(config.prompt_lookup_max_ngram, config.prompt_lookup_min_ngram)

    def session_key(self) -> tuple:
        return ("prompt_lookup",)

    def searches_on_device(self, state: DecodeState) -> bool:
        return state.batch_size >= DEVICE_SEARCH_MIN_BATCH or (
            state.device.type == "cuda" and state.prompt_len >= DEVICE_SEARCH_MIN_PROMPT
        )

    def propose(
        self, state: DecodeState, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor] | list[list[int]]:
        """What `get_candidates` would draft now, without a draft: ``(drafts, counts)`` on the device where the
        search runs there (counts 0 for inactive rows; both overwritten by the next `propose` with this K), else
        one host list per row (empty for inactive rows)."""
        if self.searches_on_device(state):
            return self._device_search(state, num_tokens, "propose")
        return self._host_search(state, num_tokens)

    def _device_search(
        self, state: DecodeState, num_tokens: int, caller: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The device search of ``state`` for ``num_tokens`` drafts: one `NgramLookup` per caller and K, kept
        across steps and requests of the same layout; a request's tensors are checked at its first search."""
        first = self._searched is not state
        if first:
            self._searched = state
            layout = (state.batch_size, state.tokens.shape[1], state.device, DEVICE_SEARCH_KERNEL)
            if layout != self._layout:
                self._layout, self._searches = layout, {}
        search = self._searches.get((caller, num_tokens))
        if search is None:
            batch, capacity, device, kernel = self._layout
            search = NgramLookup(batch, capacity, num_tokens, self.max_ngram, self.min_ngram, device, kernel)
            self._searches[(caller, num_tokens)] = search
        if first:
            search.check(state.tokens, state.committed_t, state.pad_t, state.active_t)
        return search(state.tokens, state.committed_t, state.pad_t, state.active_t)

    def _host_search(self, state: DecodeState, num_tokens: int) -> list[list[int]]:
        indexes = self._row_indexes(state)
        host = state.host_tokens
        found = []
        for row, index in enumerate(indexes):
            if not state.active[row]:
                found.append([])
                continue
            indexed = state.pad[row] + len(index.tokens)
            if indexed < state.committed[row]:
                index.extend(host[row, indexed : state.committed[row]].tolist())
            found.append(index.lookup(num_tokens))
        return found

    def get_candidates(self, state: DecodeState, num_tokens: int) -> Draft:  # type: ignore[override]
        if self.searches_on_device(state):
            drafts, counts = self._device_search(state, num_tokens, "draft")
            return Draft(drafts, counts, None, None)
        drafts = np.zeros((state.batch_size, num_tokens + 1), dtype=np.int64)  # last column: the counts
        counts = [0] * state.batch_size
        for row, found in enumerate(self._host_search(state, num_tokens)):
            drafts[row, : len(found)] = found
            counts[row] = len(found)
        drafts[:, num_tokens] = counts
        both = self._to_device(drafts, state.device)
        return Draft(both[:, :num_tokens], both[:, num_tokens], None, counts)

    def _row_indexes(self, state: DecodeState) -> list[NgramIndex]:
        if self._state is not state:  # a new request
            self._state = state
            self._indexes = [NgramIndex(self.max_ngram, self.min_ngram) for _ in range(state.batch_size)]
        return self._indexes

    def _to_device(self, host: np.ndarray, device: torch.device) -> torch.Tensor:
        """``host`` on ``device`` in one asynchronous copy from a pinned buffer kept across steps. Two buffers in
        turn: the copy from one is finished before the host writes it again, since the step's readback in
        between waits for the verify forward that reads the copied drafts."""
        if device.type != "cuda":
            return torch.from_numpy(host)
        if not self._staging or self._staging[0].numel() < host.size:
            self._staging = [
                torch.empty(max(host.size, 64), dtype=torch.int64, pin_memory=True) for _ in "ab"
            ]
        self._staging.reverse()
        staging = self._staging[0][: host.size].view(host.shape)
        staging.numpy()[...] = host
        return staging.to(device, non_blocking=True)

    def close(self) -> None:
        self._state, self._indexes, self._searched = None, [], None
