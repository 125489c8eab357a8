"""`TokenByToken`: a linear-attention or state-space layer of a hybrid model (the Gated DeltaNet of Qwen3-Next,
Qwen3.5, OLMo-Hybrid and Lara-Mini; the Mamba mixers of Bamba, Jamba, Granite 4 and Nemotron-H, and of the pure
state-space models Mamba and FalconMamba) run one token at a time in verify steps, so the cache keeps its recurrent state after every token and rejected drafts roll back for free.

transformers' layer advances its recurrent state over a whole call and hands the cache only the state after the last
token (its chunked rule over the K + 1 tokens of a verify step). After a verify, though, the state needed is the one
after the last *accepted* token. Plain ``generate`` decodes one token per call with the layer's recurrent rule; the
wrapper makes a verify step do the same, calling the original layer unchanged on each token in turn under that
token's own step (`StepContext.token`), so the cache (`hf_sparse_verify.attention.cache.SpecConvLayer`) stores each
token's state at that token's slot and the next step, which starts after the last accepted token, reads the right
one. The arithmetic is plain ``generate``'s, token for token; prefill steps pass through (one chunked call, as plain
``generate`` prefills). The price: ``K + 1`` calls of the layer per verify step instead of one.
"""

from __future__ import annotations

import torch

from .._compat import RECURRENT_LAYER_CLASSES
from ..attention.cache import SpecConvLayer
from ..step import Phase, current_step, step_scope


def wraps(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a linear-attention layer `TokenByToken` runs."""
    return type(module).__name__ in RECURRENT_LAYER_CLASSES


class TokenByToken(torch.nn.Module):
    """Runs ``layer`` (kept as ``self.layer``; nothing copied) once per token in steps of several tokens that are not
    prefill steps; otherwise calls it as it is."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer
        self.layer_idx = getattr(layer, "layer_idx", None)

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs) -> torch.Tensor:
        step = current_step(required=False)
        width = hidden_states.shape[1]
        if step is None or cache is None or step.phase is Phase.PREFILL or width == 1:
            out = self.layer(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
            self._settle(cache)
            return out
        if width > SpecConvLayer.RING:
            raise ValueError(
                f"a verify step of {width} tokens is wider than the {SpecConvLayer.RING} recurrent states the cache "
                f"keeps per row: set max_draft_tokens below {SpecConvLayer.RING}"
            )
        outputs = []
        for index in range(width):  # a generated or drafted token is never padding: no mask
            with step_scope(step.token(index)):
                outputs.append(self.layer(hidden_states[:, index : index + 1], cache=cache, **kwargs))
                self._settle(cache)
        return torch.cat(outputs, dim=1)

    def _settle(self, cache) -> None:
        """Keep a state the layer advanced in place (`SpecConvLayer.settle`)."""
        layers = getattr(cache, "layers", None)
        layer = layers[self.layer_idx] if layers is not None and self.layer_idx is not None else None
        if isinstance(layer, SpecConvLayer):
            layer.settle()
