"""`ModelRunner`: one model plus its `SpecCache`, run one step at a time (used for the target and draft models)."""

from __future__ import annotations

import torch

from ..attention import SpecCache, StepInfo
from ..attention.interface import STEP_KWARG


class ModelRunner:
    """Runs ``model`` on ``[B, W]`` tokens written at per-row cache slots, through the ``"sparse_verify"``
    attention.

    Args:
        model: a causal LM already switched to the ``"sparse_verify"`` attention.
        batch: rows.
        capacity: KV slots per row.
        pad: host list, left padding per row.
        out_device: where float32 logits are returned.
        backend: attention backend name.
    """

    def __init__(
        self, model, batch: int, capacity: int, pad: list[int], out_device, backend: str = "reference"
    ):
        self.model = model
        self.cache = SpecCache(model.config.get_text_config().num_hidden_layers, batch, capacity)
        self.pad = pad
        self.device = model.get_input_embeddings().weight.device
        self.pad_t = torch.tensor(pad, device=self.device)
        self.out_device = out_device
        self.backend = backend

    def forward(
        self,
        ids: torch.Tensor,
        start: list[int],
        phase: str,
        *,
        layer_states: list | None = None,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Write ``ids`` ``[B, W]`` at slots ``start[b] ..`` of each row; float32 logits ``[B, W or keep, V]``."""
        width = ids.shape[1]
        start_t = torch.tensor(start, device=self.device)
        step = StepInfo(
            phase,
            start_t,
            self.pad_t,
            q_len=width,
            kv_len=max(start) + width,
            layer_states=layer_states,
            backend=self.backend,
            no_padding=max(self.pad) == 0,
            uniform_start=len(set(start)) == 1,
        )
        positions = ((start_t - self.pad_t)[:, None] + torch.arange(width, device=self.device)).clamp_min(0)
        self.cache.begin_step(step)
        try:
            out = self.model(
                input_ids=ids.to(self.device),
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **{STEP_KWARG: step},
            )
        finally:
            self.cache.end_step()
        return out.logits.to(self.out_device, torch.float32)
