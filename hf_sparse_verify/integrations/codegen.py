"""`CodeGenAttentionDispatch`: CodeGen's self-attention, dispatched through transformers' `AttentionInterface`.

CodeGen's attention is GPT-J's (`hf_sparse_verify.integrations.gptj`: interleaved rotary over ``rotary_dim``, scale
``1 / sqrt(head_dim)``) with one fused ``qkv_proj`` laid out for 4 model-parallel shards (``mp_num = 4`` in the
transformers source): ``[B, T, 3 * hidden]`` is 4 shards, each holding its query, value, then key features of
``H / 4`` heads. The original adds the mask before scaling (``(q k^T + mask) / sqrt(D)``), which masks the same
entries. Checked against transformers 5.23.0.

Precision: the original rotates with sin/cos in the table's dtype and caches the key in the model's dtype; the
query stays in the promoted dtype and ``q k^T`` and the softmax run in float32. Here query and key are cast to the
model's dtype and the attention function computes in it (identical for float32 models).
"""

from __future__ import annotations

import torch

from .gptj import GPTJAttentionDispatch, apply_rotary_every_two

#: attention classes of ``transformers.models.codegen.modeling_codegen`` this module stands in for
REPLACEABLE = frozenset({"CodeGenAttention"})

#: model-parallel shards of CodeGen's fused projection (``mp_num``, a constant of the transformers source)
MP_NUM = 4


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a CodeGen attention module (`REPLACEABLE`) that runs its own attention: one that keeps
    its sinusoid table ``embed_positions`` (transformers < 5.24; from 5.24 the module takes the model's rotary
    embedding and dispatches through `AttentionInterface` itself, so it needs no stand-in)."""
    return type(module).__name__ in REPLACEABLE and hasattr(module, "embed_positions")


class CodeGenAttentionDispatch(GPTJAttentionDispatch):
    """Stand-in for a ``CodeGenAttention``, sharing its ``qkv_proj``, ``out_proj`` and ``embed_positions``.

    Args:
        original: a module for which `replaceable_attention` holds.
        config: the model's config (``CodeGenAttention`` keeps none); its ``_attn_implementation`` picks the
            attention function at each call.
    """

    reads = ("qkv_proj", "out_proj", "embed_positions", "config", "layer_idx", "rotary_dim")

    def __init__(self, original: torch.nn.Module, config=None):
        torch.nn.Module.__init__(self)
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not one of {sorted(REPLACEABLE)}; leave it in place"
            )
        if config is None:
            raise ValueError("CodeGenAttention keeps no config: pass the model's (model.config)")
        self.qkv_proj = original.qkv_proj
        self.out_proj = original.out_proj
        self.embed_positions = original.embed_positions  # [max_positions, rotary_dim]: sines, then cosines
        self.config = config
        self.layer_idx = original.layer_idx
        self.rotary_dim = original.rotary_dim
        self.num_heads = original.num_attention_heads
        self.head_dim = original.head_dim
        self.num_key_value_groups = 1
        self.scaling = self.head_dim**-0.5
        self.is_causal = True

    def _project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key and value ``[B, T, H, D]`` from the sharded fused projection; head ``s * H / 4 + h`` is head
        ``h`` of shard ``s``."""
        shards = self.qkv_proj(hidden_states).unflatten(-1, (MP_NUM, -1))  # [B, T, 4, 3 * hidden / 4]
        query, value, key = shards.chunk(3, dim=-1)  # each [B, T, 4, H / 4 * D]
        shape = (*hidden_states.shape[:-1], self.num_heads, self.head_dim)
        return query.reshape(shape), key.reshape(shape), value.reshape(shape)

    def _rotate(self, query, key, sin, cos, dtype):
        """CodeGen rotates with sin/cos in the table's dtype; the results are cast to the model's dtype."""
        return (
            apply_rotary_every_two(query, sin, cos, self.rotary_dim).to(dtype),
            apply_rotary_every_two(key, sin, cos, self.rotary_dim).to(dtype),
        )
