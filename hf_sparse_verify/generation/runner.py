"""`ModelRunner`: one model plus its `SpecCache`, run one step at a time (used for the target and draft models),
eagerly or by replaying captured CUDA graphs (`generation.graphs`)."""

from __future__ import annotations

import torch

from ..attention import SpecCache, StepInfo
from ..attention.interface import STEP_KWARG
from .graphs import StepGraphs, warn_once


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
        self.graphs: StepGraphs | None = None
        self.use_graphs = False  # set by the loop: steps are captured after the prefill

    def can_capture(self) -> bool:
        """CUDA graphs need a CUDA model and the ``triton`` backend (whose kernels read lengths on the device)."""
        return self.device.type == "cuda" and self.backend == "triton"

    def capture(self, widths, phase: str = "verify", layer_states: list | None = None) -> bool:
        """Capture one CUDA graph per width in ``widths`` (after the prefill); with ``layer_states``, for steps of
        ``phase`` that pass exactly that list. On failure warn once, drop every graph (eager steps) and return
        False."""
        if not self.can_capture():
            return False
        try:
            if self.graphs is None:
                self.graphs = StepGraphs(self)
            self.graphs.add(widths, phase, layer_states)
        except Exception as err:  # capture can fail inside any module: fall back, say why once
            self.graphs = None
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            warn_once(
                type(self.model).__name__,
                f"hf_sparse_verify: CUDA-graph capture of {type(self.model).__name__} failed "
                f"({type(err).__name__}: {err}); running eager steps instead. Set "
                "SpeculationConfig(cuda_graphs=False) to skip the attempt.",
            )
            return False
        return True

    def run_model(self, ids: torch.Tensor, step: StepInfo, logits_to_keep: int = 0) -> torch.Tensor:
        """One forward with ``step`` announced to the cache; the model's logits as they come."""
        positions = (step.start - step.pad)[:, None] + torch.arange(step.q_len, device=self.device)
        self.cache.begin_step(step)
        try:
            out = self.model(
                input_ids=ids,
                position_ids=positions.clamp_min(0),
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **{STEP_KWARG: step},
            )
        finally:
            self.cache.end_step()
        return out.logits

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
        entry = self.graphs.find(phase, width, layer_states) if self.graphs and not logits_to_keep else None
        if entry is not None:
            logits = self.graphs.replay(entry, ids.to(self.device), start)
            return logits.to(self.out_device, torch.float32, copy=True)
        step = StepInfo(
            phase,
            torch.tensor(start, device=self.device),
            self.pad_t,
            q_len=width,
            kv_len=max(start) + width,
            layer_states=layer_states,
            backend=self.backend,
            no_padding=max(self.pad) == 0,
            uniform_start=len(set(start)) == 1,
        )
        logits = self.run_model(ids.to(self.device), step, logits_to_keep)
        return logits.to(self.out_device, torch.float32)
