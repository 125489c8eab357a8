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
import torch.nn.functional as F

from .._compat import GATED_DELTA_LAYOUTS, RECURRENT_LAYER_CLASSES, gated_delta_functions
from ..attention.cache import SpecConvLayer
from ..kernels._triton import compiled_on
from ..kernels.gated_delta import gated_delta_ring
from ..step import Phase, current_step, step_scope


def wraps(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a linear-attention layer `TokenByToken` (or `GatedDeltaWindow`) runs."""
    return type(module).__name__ in RECURRENT_LAYER_CLASSES


def recurrent_runner(module: torch.nn.Module) -> torch.nn.Module | None:
    """The verify-step runner of a recurrent layer: `GatedDeltaWindow` for the Gated DeltaNet layouts it knows,
    `TokenByToken` for the other recurrent classes, None for any other module."""
    if type(module).__name__ in GATED_DELTA_LAYOUTS:
        return GatedDeltaWindow(module)
    return TokenByToken(module) if wraps(module) else None


def _check_width(width: int) -> None:
    if width > SpecConvLayer.RING:
        raise ValueError(
            f"a verify step of {width} tokens is wider than the {SpecConvLayer.RING} recurrent states the cache "
            f"keeps per row: set max_draft_tokens below {SpecConvLayer.RING}"
        )


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
        _check_width(width)
        outputs = []
        for index in range(width):  # a generated or drafted token is never padding: no mask
            with step_scope(step.token(index)):
                outputs.append(self.layer(hidden_states[:, index : index + 1], cache=cache, **kwargs))
                self._settle(cache)
        return torch.cat(outputs, dim=1)

    def _settle(self, cache) -> None:
        """Keep a state the layer advanced in place (`SpecConvLayer.settle`)."""
        layer = _kept_by(cache, self.layer_idx)
        if layer is not None:
            layer.settle()


def _kept_by(cache, layer_idx: int | None) -> SpecConvLayer | None:
    """The `SpecConvLayer` holding layer ``layer_idx``'s states in ``cache``, if our cache holds them."""
    layers = getattr(cache, "layers", None)
    layer = layers[layer_idx] if layers is not None and layer_idx is not None else None
    return layer if isinstance(layer, SpecConvLayer) else None


class GatedDeltaWindow(torch.nn.Module):
    """A Gated DeltaNet layer (Qwen3-Next, Qwen3.5, Lara-Mini, OLMo-Hybrid; `_compat.GATED_DELTA_LAYOUTS`) in
    verify steps: the input projections, the short convolution, the gates, the gated norm and the output projection
    run once over the step's tokens, so the layer's weights are read once per step instead of ``K + 1`` times; the
    cache keeps the state after every token (`SpecConvLayer`), as with `TokenByToken`. The recurrence: on a GPU with
    compiled Triton (`compiled_on`, as for the fused modules), one launch over the window (`kernels.gated_delta`:
    the state read from the cache's ring once, the state after every token written straight into it); elsewhere token by token under each token's own step, with the recurrent rule of the layer's modeling
    module (`_compat.gated_delta_functions`). The rest is the layer's own linear layers, norm and causal
    convolution. Prefill steps call the layer as it is, and so do one-token steps where the kernel does not run."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer
        self.layer_idx = getattr(layer, "layer_idx", None)
        self.layout = GATED_DELTA_LAYOUTS[type(layer).__name__]
        self.recurrent_rule, self.conv = gated_delta_functions(layer)

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs) -> torch.Tensor:
        step = current_step(required=False)
        batch, width = hidden_states.shape[:2]
        kept = _kept_by(cache, self.layer_idx)
        kernel = kept is not None and kept.ring is not None and compiled_on(hidden_states.device)
        # one-token steps take the window too where the kernel runs: it reads and writes the ring in place, where
        # the layer's own call gathers the state out of the ring and scatters it back
        if step is None or cache is None or step.phase is Phase.PREFILL or (width == 1 and not kernel):
            return self.layer(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
        _check_width(width)
        layer = self.layer
        if self.layout == "qkvz":
            query, key, value, z, b, a = layer.fix_query_key_value_ordering(
                layer.in_proj_qkvz(hidden_states), layer.in_proj_ba(hidden_states)
            )
            mixed = torch.cat([x.reshape(batch, width, -1) for x in (query, key, value)], dim=-1)
            norm, out_proj = layer.norm, layer.out_proj
        elif self.layout == "qkv":
            mixed = layer.in_proj_qkv(hidden_states)
            z = layer.in_proj_z(hidden_states)
            b, a = layer.in_proj_b(hidden_states), layer.in_proj_a(hidden_states)
            norm, out_proj = layer.norm, layer.out_proj
        else:  # "q_k_v"
            projections = (layer.q_proj, layer.k_proj, layer.v_proj)
            mixed = torch.cat([proj(hidden_states) for proj in projections], dim=-1)
            z = layer.g_proj(hidden_states)
            b, a = layer.b_proj(hidden_states), layer.a_proj(hidden_states)
            norm, out_proj = layer.o_norm, layer.o_proj
        # the convolution over the inputs before the step and the step's own (a generated or drafted token is never
        # padding: no mask), its last `width` outputs kept
        window = cache.update_conv_state(
            mixed.transpose(1, 2), layer.layer_idx, conv_kernel_size=layer.conv_kernel_size
        )
        mixed = self.conv(window, layer.conv1d.weight.squeeze(1), layer.conv1d.bias, activation=layer.activation)
        mixed = mixed[:, :, -width:].transpose(1, 2)
        query, key, value = torch.split(mixed, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
        query = query.reshape(batch, width, -1, layer.head_k_dim)
        key = key.reshape(batch, width, -1, layer.head_k_dim)
        value = value.reshape(batch, width, -1, layer.head_v_dim)
        beta = b.sigmoid()
        if getattr(layer, "allow_neg_eigval", False):  # OLMo-Hybrid's option: beta in (0, 2)
            beta = beta * 2.0
        g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
        if kernel:
            # one launch: the state read from the cache's ring once, the state after every token written there
            core = gated_delta_ring(query, key, value, g, beta, kept.ring, kept.ring_start())
        else:
            outputs = []
            for index in range(width):
                with step_scope(step.token(index)):
                    state = cache.get_recurrent_state(layer.layer_idx, state_idx=0)
                    token = slice(index, index + 1)
                    out, state = self.recurrent_rule(
                        query[:, token], key[:, token], value[:, token], g=g[:, token], beta=beta[:, token],
                        initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True,
                    )  # fmt: skip
                    cache.update_recurrent_state(state, layer.layer_idx)
                    outputs.append(out)
            core = torch.cat(outputs, dim=1)
        core = norm(core.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
        return out_proj(core.reshape(batch, width, -1))
