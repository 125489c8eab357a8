"""`FusedDecoderLayer`: a Llama-family pre-norm decoder layer whose two residual adds share a launch with the kernel
next to them.

transformers' ``LlamaDecoderLayer.forward`` (and Mistral's, Mixtral's, OLMoE's, Qwen2's, Qwen2-MoE's, Qwen3's,
Qwen3-MoE's; `REPLACEABLE`, checked against the sources of transformers 5.17.0 and 5.24.0, which differ only in the
cache keyword's name) computes::

    h = x + self_attn(input_layernorm(x))
    out = h + mlp(post_attention_layernorm(h))

Each ``+`` is a torch elementwise kernel of its own, which cannot overlap its neighbours through programmatic
dependent launch as our kernels do (`hf_sparse_verify.kernels._triton.pdl_launch`). This module computes the same,
sharing the original's submodules (nothing copied):

- the first add and the post-attention RMSNorm are one launch (`hf_sparse_verify.kernels.rms_norm.add_rms_norm`);
- where the next decoder layer is one of these on the same device (`FusedDecoderLayer.link`), the second add of a
  dense MLP and the next layer's input RMSNorm are one launch too, handed over with the sum;
- for a MoE block that is ``gate`` then ``experts`` (`FUSABLE_MOE`) whose experts run our ``"hsv_fused"``
  implementation, the second add happens in the experts' last launch (``fused_experts_forward(...,
  residual=h)``) unless hooks are registered on the experts; any other ``mlp`` (dense MLPs, Qwen2-MoE's shared
  expert) keeps a torch add.

Both fused adds are bitwise the eager ones (the sum is rounded to the activation dtype first, as eager rounds it).
The keyword arguments the model passes go to ``self_attn`` unchanged, as the originals pass them.
"""

from __future__ import annotations

import torch

from .._compat import has_forward_hooks
from ..kernels.rms_norm import add_rms_norm
from ..placement import swappable
from . import fused_experts as fused_moe
from .rms_norm import REPLACEABLE as NORM_REPLACEABLE

#: decoder layer classes whose forward is the one in the module docstring
REPLACEABLE = frozenset(
    {
        "LlamaDecoderLayer",
        "MistralDecoderLayer",
        "MixtralDecoderLayer",
        "OlmoeDecoderLayer",
        "Qwen2DecoderLayer",
        "Qwen2MoeDecoderLayer",
        "Qwen3DecoderLayer",
        "Qwen3MoeDecoderLayer",
    }
)
#: MoE blocks whose forward is ``_, weights, index = gate(rows); experts(rows, index, weights)`` on the flattened
#: rows (Mixtral's also adds jitter noise, in training only), so the residual can be handed to the experts
FUSABLE_MOE = frozenset({"MixtralSparseMoeBlock", "OlmoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock"})


def replaceable_decoder_layer(module: torch.nn.Module) -> bool:
    """Whether `FusedDecoderLayer` computes what ``module`` computes: an allow-listed class whose two norms are
    Llama-family RMSNorms (`hf_sparse_verify.integrations.rms_norm.REPLACEABLE`), with no accelerate hook or offloaded
    weight on it or below it (a replacement would skip the hook)."""
    if type(module).__name__ not in REPLACEABLE:
        return False
    norms = [getattr(module, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
    if not all(type(n).__name__ in NORM_REPLACEABLE for n in norms):
        return False
    if not all(hasattr(module, n) for n in ("self_attn", "mlp")):
        return False
    return all(swappable(m) for m in module.modules())


class FusedDecoderLayer(torch.nn.Module):
    """Stand-in for a Llama-family decoder layer (`REPLACEABLE`), sharing its ``input_layernorm``, ``self_attn``,
    ``post_attention_layernorm`` and ``mlp`` (other module replacements may swap those inside it).

    Args:
        original: a module for which `replaceable_decoder_layer` holds.
    """

    reads = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp", "attention_type")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_decoder_layer(original):
            raise ValueError(
                f"{type(original).__name__} is not a decoder layer of {sorted(REPLACEABLE)} with Llama-family "
                "RMSNorms and no accelerate hooks; leave it in place"
            )
        self.input_layernorm = original.input_layernorm
        self.self_attn = original.self_attn
        self.post_attention_layernorm = original.post_attention_layernorm
        self.mlp = original.mlp
        if hasattr(original, "attention_type"):  # read by some models' forward to pick the layer's mask
            self.attention_type = original.attention_type
        self.original_class = type(original).__name__
        self._next: list = []  # the decoder layer run next, when `link` named it (a list: not a submodule)
        self._handed: tuple | None = None  # (hidden states, their input RMSNorm) the layer before computed

    def link(self, following: FusedDecoderLayer) -> None:
        """Names the layer the model runs right after this one (on the same device): this layer's last residual add
        then also computes ``following``'s input RMSNorm in the same launch, and hands it over with the sum; the
        following layer takes it when the hidden states it is given are that very sum (anything that came between
        gives another tensor, and the layer then normalizes as before)."""
        self._next = [following]

    def _experts_take_residual(self) -> bool:
        """Whether ``mlp`` is a `FUSABLE_MOE` block whose experts run our fused implementation now (read per call:
        `hf_sparse_verify.integrations.Switched.decoding_experts` switches it)."""
        mlp = self.mlp
        if type(mlp).__name__ not in FUSABLE_MOE or (self.training and getattr(mlp, "jitter_noise", 0) > 0):
            return False
        experts = getattr(mlp, "experts", None)
        config = getattr(experts, "config", None)
        if getattr(config, "_experts_implementation", None) != fused_moe.NAME:
            return False
        return not has_forward_hooks(
            experts
        )  # e.g. RouterStats' calibration hook: called directly, it would not run

    def forward(self, hidden_states: torch.Tensor, **kwargs):
        """``hidden_states`` ``[B, T, H]`` and the keyword arguments the model passes its decoder layers (handed
        to ``self_attn`` as they are) -> ``[B, T, H]``."""
        handed, self._handed = self._handed, None
        if handed is not None and handed[0] is hidden_states:
            x = handed[1]  # normalized by the layer before, in its last residual add's launch
        else:
            x = self.input_layernorm(hidden_states)
        x, _ = self.self_attn(hidden_states=x, **kwargs)
        norm = self.post_attention_layernorm
        x, residual = add_rms_norm(x, hidden_states, norm.weight, norm.variance_epsilon)
        if not self._experts_take_residual():
            if not self._next:
                return residual + self.mlp(x)
            following = self._next[0]
            next_norm = following.input_layernorm
            normed, out = add_rms_norm(self.mlp(x), residual, next_norm.weight, next_norm.variance_epsilon)
            following._handed = (out, normed)
            return out
        batch, length, dim = x.shape
        rows = x.reshape(-1, dim)
        _, weights, index = self.mlp.gate(rows)
        out = fused_moe.fused_experts_forward(
            self.mlp.experts, rows, index, weights, residual=residual.reshape(-1, dim)
        )
        return out.reshape(batch, length, dim)
