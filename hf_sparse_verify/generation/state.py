"""`DecodeState`: the token histories of a batch, shared by the loop and the drafters."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DecodeState:
    """Token histories of a batch of left-padded rows.

    Row ``b`` holds its history (left padding, prompt, generated tokens) in ``tokens[b, :committed[b]]``; its
    last token is the *pending* token, not yet in the target's KV cache, so the target cache holds
    ``committed[b] - 1`` slots of row ``b``. Slots past ``committed[b]`` hold stale drafts and are never read.

    Attributes:
        tokens: ``[B, capacity]`` int64 on the device where logits are processed.
        host_tokens: CPU copy of ``tokens`` (kept in step by the loop; drafters that search the history use it).
        pad: left padding per row (host list) and ``pad_t`` the same as a ``[B]`` tensor on ``tokens.device``.
        committed: history length per row (host list).
        active: rows still generating (host list).
        prompt_len: padded prompt width.
        do_sample: sampling (True) or greedy (False).
        processors: the call's logits processors (drafters may use their history-free part).
    """

    tokens: torch.Tensor
    host_tokens: torch.Tensor
    pad: list[int]
    pad_t: torch.Tensor
    committed: list[int]
    active: list[bool]
    prompt_len: int
    do_sample: bool
    processors: object

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def write(self, row_start: list[int], new_tokens: torch.Tensor, host_new: torch.Tensor) -> None:
        """Write ``new_tokens`` ``[B, n]`` at ``row_start[b]`` of every row (device and host copies)."""
        width = new_tokens.shape[1]
        slots = torch.tensor(row_start, device=self.tokens.device)[:, None] + torch.arange(
            width, device=self.tokens.device
        )
        self.tokens.scatter_(1, slots, new_tokens.to(self.tokens.device))
        host_slots = torch.tensor(row_start)[:, None] + torch.arange(width)
        self.host_tokens.scatter_(1, host_slots, host_new)
