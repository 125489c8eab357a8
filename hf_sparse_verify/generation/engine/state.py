"""`DecodeState`: the token histories of a batch, on the device, with host mirrors kept from the step's one
readback."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def to_device(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A host list on ``device`` without a host synchronisation (pinned staging buffer, asynchronous copy)."""
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


@dataclass
class DecodeState:
    """Token histories of a batch of left-padded rows.

    Row ``b`` holds its history (left padding, prompt, generated tokens) in ``tokens[b, :committed[b]]``; its
    last token is the *pending* token, not yet in the target's KV cache, so the target cache holds
    ``committed[b] - 1`` slots of row ``b``. Slots past ``committed[b]`` hold stale drafts and are never read.

    The device tensors (``tokens``, ``committed_t``, ``active_t``) are what steps read; they advance on the
    device (`advance`). The host mirrors (``host_tokens``, ``committed``, ``active``) are updated from the step's
    readback (`settle`), which also applies stopping and corrects the device copies of rows that stopped.

    Attributes:
        tokens: ``[B, capacity]`` int64 on the device where logits are processed; ``host_tokens`` its CPU mirror.
        pad / pad_t: left padding per row (host list / ``[B]`` tensor on ``tokens.device``).
        committed / committed_t: history length per row (host list / ``[B]`` int64 on the device).
        active / active_t: rows still generating (host list / ``[B]`` bool on the device).
        prompt_len: padded prompt width.
        do_sample: sampling (True) or greedy (False).
        processors: the call's logits processors (drafters may use their history-free part).
    """

    tokens: torch.Tensor
    host_tokens: torch.Tensor
    pad: list[int]
    pad_t: torch.Tensor
    committed: list[int]
    committed_t: torch.Tensor
    active: list[bool]
    active_t: torch.Tensor
    prompt_len: int
    do_sample: bool
    processors: object

    @classmethod
    def start(
        cls,
        input_ids: torch.Tensor,
        pads: list[int],
        capacity: int,
        pad_token_id: int,
        do_sample: bool,
        processors,
    ) -> DecodeState:
        batch, prompt_len = input_ids.shape
        device = input_ids.device
        tokens = torch.full((batch, capacity), pad_token_id, dtype=torch.long, device=device)
        tokens[:, :prompt_len] = input_ids
        host = torch.full((batch, capacity), pad_token_id, dtype=torch.long)
        host[:, :prompt_len] = input_ids.cpu()
        return cls(
            tokens=tokens,
            host_tokens=host,
            pad=list(pads),
            pad_t=to_device(pads, device),
            committed=[prompt_len] * batch,
            committed_t=torch.full((batch,), prompt_len, dtype=torch.long, device=device),
            active=[True] * batch,
            active_t=torch.ones(batch, dtype=torch.bool, device=device),
            prompt_len=prompt_len,
            do_sample=do_sample,
            processors=processors,
        )

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def pending_slots(self) -> torch.Tensor:
        """``[B]`` cache slot of each row's pending token (``committed - 1``), on the device."""
        return self.committed_t - 1

    def pending_tokens(self) -> torch.Tensor:
        """``[B, 1]`` each row's pending token."""
        return self.tokens.gather(1, self.pending_slots()[:, None])

    def max_pending(self) -> int:
        """Host-side ``max(committed) - 1`` (the highest pending slot)."""
        return max(self.committed) - 1

    def uniform(self) -> bool:
        """Host-side fact: every row has the same history length."""
        return len(set(self.committed)) == 1

    def advance(self, accepted: torch.Tensor, new_tokens: torch.Tensor) -> None:
        """Device side of a step: write ``new_tokens`` ``[B, n]`` after each history and move active rows on by
        ``accepted + 1`` (stopping is applied later, by `settle`)."""
        slots = self.committed_t[:, None] + torch.arange(new_tokens.shape[1], device=self.device)
        self.tokens.scatter_(1, slots.clamp_max(self.tokens.shape[1] - 1), new_tokens.to(self.device))
        self.committed_t += (accepted.to(self.device) + 1) * self.active_t

    def settle(self, readback: torch.Tensor, stop) -> tuple[list[int | None], list[int]]:
        """Host side of a step, from the readback ``[B, 2 + n]`` (accepted, drafts proposed, the step's tokens).

        Applies ``stop`` (a `StopChecker`) per active row; rows that stop early get their device length and
        activity corrected (an asynchronous upload). Returns the drafts per row that entered the history (None
        for rows that were inactive) and the history lengths before the step.
        """
        before = list(self.committed)
        accepted_rows: list[int | None] = [None] * self.batch_size
        corrected = False
        for b in range(self.batch_size):
            if not self.active[b]:
                continue
            m = int(readback[b, 0])
            emitted = readback[b, 2 : m + 3]
            self.host_tokens[b, before[b] : before[b] + m + 1] = emitted
            kept, finished = stop.keep(self.tokens, b, before[b], emitted.tolist())
            accepted_rows[b] = min(m, kept)
            self.committed[b] = before[b] + kept
            self.active[b] = not finished
            corrected |= finished or kept != m + 1
        if corrected:
            self.committed_t.copy_(to_device(self.committed, self.device), non_blocking=True)
            self.active_t.copy_(to_device(self.active, self.device, torch.bool), non_blocking=True)
        return accepted_rows, before
