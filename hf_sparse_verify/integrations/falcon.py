"""`FalconAttentionDispatch`: Falcon's rotary self-attention, dispatched through transformers' `AttentionInterface`.

transformers' ``FalconAttention.forward`` calls SDPA or its own softmax instead of
``ALL_ATTENTION_FUNCTIONS.get_interface(...)``, so the ``"sparse_verify"`` attention never sees a Falcon layer.
For the duration of a call (`hf_sparse_verify.integrations.speculation_mode`) each ``FalconAttention`` of a
rotary Falcon (``config.alibi=False``: Falcon-7B/40B/180B, Falcon 2) is replaced by this module, which shares the
original's ``query_key_value`` and ``dense`` projections and computes what the original computes up to the
attention function: the fused projection split into query, key and value heads, the rotary embedding from the
``position_embeddings`` the model passes, the cache update; then the registered attention function and ``dense``.

Falcon's three projection layouts (checked against transformers 5.17.0 and 5.23.0, identical in both):

- ``new_decoder_architecture`` (Falcon-40B/180B, Falcon 2): per KV head, its query heads, then one key and one value
  head. Falcon broadcasts each key/value head to its query heads before caching; we cache ``num_kv_heads`` heads and
  let the attention function group the queries (the same attention, a group-size smaller cache).
- ``multi_query`` (Falcon-7B): all query heads, then one key and one value head.
- neither: per head, its query, key and value (plain multi-head attention).

ALiBi Falcon (``config.alibi=True``) is not replaced: the bias is not implemented by our attention, and
`hf_sparse_verify._compat.architecture_refusal` refuses it.
"""

from __future__ import annotations

import math

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..kernels.qkv_rope.naive import rotate_half
from .gptj import _no_eager

#: attention classes of ``transformers.models.falcon.modeling_falcon`` this module stands in for (both keep their
#: weights in ``query_key_value`` and ``dense``; the flash-attention class only overrides ``forward``)
REPLACEABLE = frozenset({"FalconAttention", "FalconFlashAttention2"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a Falcon attention of a rotary model (`REPLACEABLE`, ``config.alibi`` False)."""
    return type(module).__name__ in REPLACEABLE and not module.config.alibi


# The splits take the fused projection ``[B, T, width]`` and return query ``[B, H, T, D]``, key and value
# ``[B, H_kv, T, D]`` (views where the layout allows).


def _split_grouped(fused: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    """``new_decoder_architecture``: ``[B, T, H_kv * (H / H_kv + 2) * D]``, per KV head its queries, key, value."""
    batch, length, _ = fused.shape
    qkv = fused.view(batch, length, kv_heads, heads // kv_heads + 2, head_dim)
    query = qkv[:, :, :, :-2].reshape(batch, length, heads, head_dim)  # query head h reads KV head h // group
    return query.transpose(1, 2), qkv[:, :, :, -2].transpose(1, 2), qkv[:, :, :, -1].transpose(1, 2)


def _split_multi_query(fused: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    """``multi_query``: ``[B, T, (H + 2) * D]``, all query heads, then one key and one value head."""
    batch, length, _ = fused.shape
    qkv = fused.view(batch, length, heads + 2, head_dim).transpose(1, 2)  # [B, H + 2, T, D]
    return qkv[:, :-2], qkv[:, -2:-1], qkv[:, -1:]


def _split_interleaved(fused: torch.Tensor, heads: int, kv_heads: int, head_dim: int):
    """Plain multi-head: ``[B, T, H * 3 * D]``, per head its query, key, value."""
    batch, length, _ = fused.shape
    qkv = fused.view(batch, length, heads, 3, head_dim).transpose(1, 2)  # [B, H, T, 3, D]
    return qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Falcon's (Llama's) half-split rotary embedding of ``x`` ``[B, H, T, D]`` with ``cos``/``sin`` ``[B, T, D]``."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class FalconAttentionDispatch(torch.nn.Module):
    """Stand-in for a rotary ``FalconAttention``, sharing its ``query_key_value`` and ``dense`` (no weight copied).

    Besides the projections it holds only constants read once from the original: the head counts, the projection
    layout, ``layer_idx`` and ``config`` (whose ``_attn_implementation`` picks the attention function at each call).
    The attributes attention functions read from their ``module`` argument are set: ``layer_idx``, ``config``,
    ``is_causal``, ``head_dim``, ``scaling``, ``num_key_value_groups`` (``training`` comes with `torch.nn.Module`).

    Args:
        original: a Falcon attention module for which `replaceable_attention` holds.
        config: unused (the original keeps its own config); accepted for `ATTENTION_REPLACEMENTS`' signature.
    """

    reads = ("query_key_value", "dense", "config", "layer_idx", "num_heads", "head_dim")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not a rotary Falcon attention of {sorted(REPLACEABLE)} "
                "(ALiBi Falcon is not supported); leave it in place"
            )
        config = original.config
        self.query_key_value = original.query_key_value
        self.dense = original.dense
        self.config = config
        self.layer_idx = original.layer_idx
        self.num_heads = original.num_heads
        self.head_dim = original.head_dim
        if config.new_decoder_architecture:
            self.num_key_value_heads, self._split = config.num_kv_heads, _split_grouped
        elif config.multi_query:
            self.num_key_value_heads, self._split = 1, _split_multi_query
        else:
            self.num_key_value_heads, self._split = self.num_heads, _split_interleaved
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.scaling = 1.0 / math.sqrt(self.head_dim)  # Falcon's rotary attention: SDPA's default scale
        self.is_causal = True

    def forward(
        self,
        hidden_states: torch.Tensor,
        alibi: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.LongTensor | None = None,
        layer_past=None,
        use_cache: bool = False,
        output_attentions: bool = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments ``FalconDecoderLayer`` passes: ``hidden_states`` ``[B, T, hidden]``, ``alibi`` (None for
        rotary models), the model's ``attention_mask`` (passed on to the attention function), ``layer_past`` (the
        cache), ``position_embeddings`` (``cos``, ``sin`` ``[B, T, D]``). Returns ``[B, T, hidden]`` and no attention
        weights."""
        if alibi is not None:
            raise NotImplementedError("ALiBi Falcon is not supported (config.alibi=True)")
        batch, length, _ = hidden_states.shape
        fused = self.query_key_value(hidden_states)
        # query [B, H, T, D], key and value [B, H_kv, T, D]
        query, key, value = self._split(fused, self.num_heads, self.num_key_value_heads, self.head_dim)
        cos, sin = position_embeddings
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _no_eager)
        # Falcon's rotary attention applies no dropout; out [B, T, H, D]
        out, _ = attention(
            self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
        )
        return self.dense(out.reshape(batch, length, self.num_heads * self.head_dim)), None
