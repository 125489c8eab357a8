"""`MptAttentionDispatch`: MPT's self-attention with ALiBi, dispatched through transformers' `AttentionInterface`.

transformers' ``MptAttention.forward`` adds the model's ALiBi ``position_bias`` to ``q k^T`` itself. For the duration
of a call (`hf_sparse_verify.integrations.speculation_mode`) each one is replaced by this module, which shares the
original's ``Wqkv`` and ``out_proj`` and computes what the original computes: the fused projection (clipped where the
config clips it) split in three, the cache update, the registered attention function with the layer's
``softmax_scale`` and ALiBi slopes (``alibi_slopes``: the ``"sparse_verify"`` attention adds ``slope * j`` to the logit
of cache slot ``j``), then ``out_proj``.

Why slopes: MPT's bias for key ``j`` of ``n`` keys is ``slope * (j - n + 1)``; the ``- slope * (n - 1)`` is the same for
every key of a query, so the softmax gives the same weights with ``slope * j``. The slopes are read off transformers'
own ``build_mpt_alibi_tensor`` (with the config's ``alibi_bias_max``). Checked against transformers 5.24.0.

Precision: the original computes the logits in the model's dtype and the softmax in float32; ours computes both in
float32 (identical for float32 models).
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .gptj import _no_eager

#: attention classes of ``transformers.models.mpt.modeling_mpt`` this module stands in for
REPLACEABLE = frozenset({"MptAttention"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an MPT self-attention module."""
    return type(module).__name__ in REPLACEABLE


def alibi_slopes(num_heads: int, alibi_bias_max: float, device) -> torch.Tensor:
    """MPT's ALiBi slope per head: minus the bias of the key one before the last in transformers' own tensor."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    return -build_mpt_alibi_tensor(num_heads, 2, alibi_bias_max, device=device)[:, 0, 0].float()


class MptAttentionDispatch(torch.nn.Module):
    """Stand-in for an ``MptAttention``, sharing its projections (no weight copied).

    Args:
        original: a module for which `replaceable_attention` holds.
        config: the model's config (its ``attn_config.alibi_bias_max``); the original does not keep it.
    """

    reads = ("Wqkv", "out_proj", "n_heads", "head_dim", "softmax_scale", "clip_qkv", "layer_idx")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(f"{type(original).__name__} is not an MptAttention; leave it in place")
        if config is None:
            raise ValueError("MptAttentionDispatch needs the model's config (its attn_config.alibi_bias_max)")
        self.Wqkv, self.out_proj = original.Wqkv, original.out_proj
        self.layer_idx = original.layer_idx
        self.num_heads = original.n_heads
        self.head_dim = original.head_dim
        self.scaling = original.softmax_scale
        self.clip_qkv = original.clip_qkv
        self.num_key_value_groups = 1
        self.is_causal = True
        self.config = config
        bias_max = config.attn_config.alibi_bias_max
        slopes = alibi_slopes(self.num_heads, bias_max, original.Wqkv.weight.device)
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_bias: torch.Tensor | None = None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments ``MptBlock`` passes (``position_bias`` and ``attention_mask`` are the model's, not needed:
        positions come from the cache slots). Returns ``[B, T, hidden]`` and no attention weights."""
        batch, length, _ = hidden_states.shape
        mixed = self.Wqkv(hidden_states)
        if self.clip_qkv:
            mixed = mixed.clamp(min=-self.clip_qkv, max=self.clip_qkv)
        shape = (batch, length, self.num_heads, self.head_dim)
        query, key, value = (t.reshape(shape).transpose(1, 2) for t in mixed.chunk(3, dim=2))
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface("sparse_verify", _no_eager)
        out, _ = attention(
            self,
            query,
            key,
            value,
            None,
            dropout=0.0,
            scaling=self.scaling,
            alibi_slopes=self.slopes,
            **kwargs,
        )
        return self.out_proj(out.reshape(batch, length, self.num_heads * self.head_dim)), None
