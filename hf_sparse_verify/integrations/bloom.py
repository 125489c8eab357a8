"""`BloomAttentionDispatch`: BLOOM's self-attention with ALiBi, dispatched through transformers' `AttentionInterface`.

transformers' ``BloomAttention.forward`` adds the model's ALiBi tensor to ``q k^T`` itself. For the duration of a call
(`hf_sparse_verify.integrations.speculation_mode`) each one is replaced by this module, which shares the original's
``query_key_value`` and ``dense`` and computes what the original computes: the fused projection split per head
(``[.., heads, 3, head_dim]``), the cache update, the registered attention function with scale
``1 / sqrt(head_dim)`` and the layer's ALiBi slopes (``alibi_slopes``: the ``"sparse_verify"`` attention adds
``slope * j`` to the logit of cache slot ``j``), then ``dense`` and the residual.

Why slopes and not the model's ``alibi`` tensor: BLOOM builds it from the attention mask as ``slope * (p_j)``, ``p_j``
the key's index among the row's unpadded tokens, which is ``slope * (j - pad)``; the row's ``- slope * pad`` is the same
for every key of a query, so the softmax gives the same weights with ``slope * j``, which the cache slots give
directly (no 2D mask is needed, and the model's positions do not matter: BLOOM has no position embeddings).
The slopes are transformers' own (``modeling_bloom._get_alibi_slopes``). Checked against transformers 5.24.0.

Precision: the original computes its softmax in float32 over logits in the model's dtype; ours computes the logits
in float32 as well (identical for float32 models). ``pretraining_tp > 1`` with ``slow_but_exact`` (a sliced output
projection) is not replaced (the call refuses the model).
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .gptj import _no_eager

#: attention classes of ``transformers.models.bloom.modeling_bloom`` this module stands in for
REPLACEABLE = frozenset({"BloomAttention"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a BLOOM self-attention module with the plain output projection."""
    return type(module).__name__ in REPLACEABLE and not (
        getattr(module, "pretraining_tp", 1) > 1 and getattr(module, "slow_but_exact", False)
    )


def alibi_slopes(num_heads: int, device) -> torch.Tensor:
    """BLOOM's ALiBi slope per head (transformers' own function)."""
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    return _get_alibi_slopes(num_heads, device)


class BloomAttentionDispatch(torch.nn.Module):
    """Stand-in for a ``BloomAttention``, sharing its projections (no weight copied).

    Args:
        original: a module for which `replaceable_attention` holds.
        config: unused (the original's is kept); accepted for `ATTENTION_REPLACEMENTS`' signature.
    """

    reads = ("query_key_value", "dense", "num_heads", "head_dim", "inv_norm_factor", "layer_idx")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not a replaceable BloomAttention; leave it in place"
            )
        self.query_key_value, self.dense = original.query_key_value, original.dense
        self.layer_idx = original.layer_idx
        self.num_heads = original.num_heads
        self.head_dim = original.head_dim
        self.scaling = original.inv_norm_factor
        self.num_key_value_groups = 1
        self.is_causal = True
        self.config = getattr(original, "config", None)
        self.register_buffer(
            "slopes", alibi_slopes(self.num_heads, original.dense.weight.device).float(), persistent=False
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        residual: torch.Tensor,
        alibi: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        layer_past=None,
        use_cache: bool = False,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments ``BloomBlock`` passes (``alibi`` and ``attention_mask`` are the model's, not needed:
        positions come from the cache slots). Returns ``[B, T, hidden]`` (residual added) and no weights."""
        batch, length, _ = hidden_states.shape
        fused = self.query_key_value(hidden_states).view(batch, length, self.num_heads, 3, self.head_dim)
        query, key, value = (fused[..., i, :].transpose(1, 2) for i in range(3))  # [B, H, T, D]
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
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
        # attention and hidden dropout are off in eval mode (our attention refuses training mode)
        return self.dense(out.reshape(batch, length, self.num_heads * self.head_dim)) + residual, None
