"""`GPTNeoXJapaneseAttentionDispatch`: GPT-NeoX-Japanese's attention, dispatched through transformers'
`AttentionInterface`.

transformers' ``GPTNeoXJapaneseAttention.forward`` runs its own ``baddbmm`` / softmax (``_attn``). For the duration
of a call (`hf_sparse_verify.integrations.speculation_mode`) each attention is replaced by this module, which shares
the original's ``query_key_value``, ``dense`` and ``dense_bias`` and computes what the original computes: the fused
projection split per head into query, key and value, the rotary embedding over the first ``rotary_ndims`` features
of each head (transformers' own ``apply_rotary_pos_emb``), the cache update, the registered attention function with
the original's ``1 / norm_factor`` scale, then ``dense``. It returns ``(output, None, dense_bias)`` as the original
does (the decoder layer adds the last layer's bias with the residual). Checked against transformers 5.24.0.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt_neox_japanese.modeling_gpt_neox_japanese import apply_rotary_pos_emb

from .gptj import _no_eager

#: attention classes of ``transformers.models.gpt_neox_japanese`` this module stands in for
REPLACEABLE = frozenset({"GPTNeoXJapaneseAttention"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a GPT-NeoX-Japanese attention module."""
    return type(module).__name__ in REPLACEABLE


class GPTNeoXJapaneseAttentionDispatch(torch.nn.Module):
    """Stand-in for a ``GPTNeoXJapaneseAttention``, sharing its weights (no weight copied).

    Args:
        original: a module for which `replaceable_attention` holds.
        config: the model's config (its ``_attn_implementation`` names the attention function).
    """

    reads = ("query_key_value", "dense", "dense_bias", "num_attention_heads", "head_size", "rotary_ndims",
             "norm_factor", "layer_idx")  # fmt: skip

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not a GPTNeoXJapaneseAttention; leave it in place"
            )
        if config is None:
            raise ValueError(
                "GPTNeoXJapaneseAttentionDispatch needs the model's config (its attention implementation)"
            )
        self.query_key_value, self.dense, self.dense_bias = (
            original.query_key_value,
            original.dense,
            original.dense_bias,
        )
        self.layer_idx = original.layer_idx
        self.num_heads = original.num_attention_heads
        self.head_dim = original.head_size
        self.rotary_ndims = original.rotary_ndims
        self.scaling = 1.0 / original.norm_factor
        self.num_key_value_groups = 1
        self.is_causal = True
        self.config = config

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        layer_past=None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None, torch.Tensor | None]:
        """The arguments ``GPTNeoXJapaneseLayer`` passes its attention. Returns ``[B, T, hidden]``, no attention
        weights, and the original's ``dense_bias``."""
        batch, length, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(batch, length, self.num_heads, 3 * self.head_dim)
        query, key, value = qkv.transpose(1, 2).split(self.head_dim, dim=-1)  # [B, H, T, D] each
        cos, sin = position_embeddings
        n = self.rotary_ndims
        query_rot, key_rot = apply_rotary_pos_emb(query[..., :n], key[..., :n], cos, sin)
        query = torch.cat((query_rot, query[..., n:]), dim=-1)
        key = torch.cat((key_rot, key[..., n:]), dim=-1)
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _no_eager)
        # attention dropout is off in eval mode (our attention refuses training mode)
        out, _ = attention(
            self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
        )
        return self.dense(out.reshape(batch, length, self.num_heads * self.head_dim)), None, self.dense_bias
