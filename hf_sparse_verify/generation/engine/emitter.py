"""`Emitter`: streams finished columns to a transformers streamer exactly as plain generation would."""

from __future__ import annotations

import torch

from .state import DecodeState


class Emitter:
    """Column ``t`` goes out once every active row has ``t + 1`` new tokens, with padding for rows that already
    stopped. Reads only the host mirrors (no synchronisation)."""

    def __init__(self, streamer, state: DecodeState, pad_token_id: int):
        self.streamer = streamer
        self.state = state
        self.pad = pad_token_id
        self.sent = 0

    def flush(self, final: bool = False) -> None:
        if self.streamer is None:
            return
        state = self.state
        generated = [c - state.prompt_len for c in state.committed]
        live = [g for g, a in zip(generated, state.active) if a]
        ready = max(generated) if (final or not live) else min(live)
        for t in range(self.sent, ready):
            column = [
                int(state.host_tokens[b, state.prompt_len + t]) if t < generated[b] else self.pad
                for b in range(state.batch_size)
            ]
            self.streamer.put(torch.tensor(column))
        self.sent = max(self.sent, ready)
        if final:
            self.streamer.end()
