"""`XGLMAttentionDispatch`: XGLM's self-attention, dispatched through transformers' `AttentionInterface`.

transformers' ``XGLMAttention.forward`` runs its own ``bmm`` / softmax. For the duration of a call
(`hf_sparse_verify.integrations.speculation_mode`) each self-attention is replaced by this module, which shares the
original's ``q_proj``/``k_proj``/``v_proj``/``out_proj`` and computes what the original computes: the projections
(positions are sinusoidal embeddings added below the layers, from ``position_ids``), the cache update, the
registered attention function with the original's ``head_dim ** -0.5`` scale (the original scales the query before
``q k^T``; the same product), then ``out_proj``. Cross-attention (``key_value_states``, only with an encoder) is not
replaced. Checked against transformers 5.24.0.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .gptj import _no_eager

#: attention classes of ``transformers.models.xglm.modeling_xglm`` this module stands in for
REPLACEABLE = frozenset({"XGLMAttention"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an XGLM attention module used as a decoder self-attention."""
    return type(module).__name__ in REPLACEABLE


class XGLMAttentionDispatch(torch.nn.Module):
    """Stand-in for an ``XGLMAttention``, sharing its projections (no weight copied).

    Args:
        original: a module for which `replaceable_attention` holds.
        config: the model's config (its ``_attn_implementation`` names the attention function).
    """

    reads = ("q_proj", "k_proj", "v_proj", "out_proj", "num_heads", "head_dim", "scaling", "layer_idx")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(f"{type(original).__name__} is not an XGLMAttention; leave it in place")
        if config is None:
            raise ValueError("XGLMAttentionDispatch needs the model's config (its attention implementation)")
        self.q_proj, self.k_proj, self.v_proj = original.q_proj, original.k_proj, original.v_proj
        self.out_proj = original.out_proj
        self.layer_idx = original.layer_idx
        self.num_heads = original.num_heads
        self.head_dim = original.head_dim
        self.scaling = original.scaling
        self.num_key_value_groups = 1
        self.is_causal = True
        self.config = config

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments ``XGLMDecoderLayer`` passes its self-attention. Returns ``[B, T, hidden]`` and no
        attention weights."""
        if key_value_states is not None:
            raise NotImplementedError("XGLM cross-attention (an encoder's states) is not supported")
        batch, length, _ = hidden_states.shape
        shape = (batch, length, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _no_eager)
        # attention dropout is off in eval mode (our attention refuses training mode)
        out, _ = attention(
            self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
        )
        return self.out_proj(out.reshape(batch, length, self.num_heads * self.head_dim)), None
