"""`SegmentLayer`: a decoder layer of a model over several GPUs, standing in for it during a call so that a step can
run each device's run of layers (a segment) as one CUDA graph.

The wrapper keeps the original layer (and its accelerate hook, which moves inputs to the layer's GPU) as its child
and calls it unchanged, except in steps whose `StepContext` carries the runner's per-device graphs
(``step.segments``, `hf_sparse_verify.generation.engine.segments.SegmentRun`): there it hands the call over, and
the first layer of a segment captures or replays the whole segment while the others pass the hidden state on.
transformers' model forward runs as it is, with the embedding, the rotary table, the final norm and the head eager.
"""

from __future__ import annotations

import torch

from ..step import current_step


class SegmentLayer(torch.nn.Module):
    """Decoder layer ``index`` of a model whose layers are spread over several GPUs.

    Args:
        layer: the original decoder layer (kept as ``self.layer``; nothing is copied).
        index: its position in the model's decoder layers.
    """

    def __init__(self, layer: torch.nn.Module, index: int):
        super().__init__()
        self.layer = layer
        self.index = index
        # attributes transformers' model forwards read on their layers (`attention_type` picks a mask)
        for name in ("attention_type", "layer_idx", "is_sliding"):
            if hasattr(layer, name):
                setattr(self, name, getattr(layer, name))

    def forward(self, hidden_states, *args, **kwargs):
        step = current_step(required=False)
        run = step.segments if step is not None else None
        if run is None:
            return self.layer(hidden_states, *args, **kwargs)
        return run.layer_call(self.index, hidden_states, args, kwargs)
