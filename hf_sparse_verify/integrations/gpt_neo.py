"""`GPTNeoAttentionDispatch`: GPT-Neo's self-attention, dispatched through transformers' `AttentionInterface`.

transformers' ``GPTNeoSelfAttention.forward`` runs its own ``_attn`` (or flash attention). For the duration of a call
(`hf_sparse_verify.integrations.speculation_mode`) each one (the ``attention`` inside ``GPTNeoAttention``) is
replaced by this module, which shares the original's ``q_proj``/``k_proj``/``v_proj``/``out_proj`` and computes
what the original computes: the projections (no rotary embedding: positions are learned, added below the layers),
the cache update, then the registered attention function with scale 1 (GPT-Neo does not scale ``q k^T``) and
``out_proj``. Checked against transformers 5.23.0.

Local layers (``config.attention_layers[i] == "local"``): the original masks with
``tril(ones) xor tril(ones, -window_size)`` sliced bottom-right, so the query at cache index ``i`` attends to
indices ``i - window_size < j <= i``: the last ``window_size`` slots, itself included. That is the
``sliding_window`` semantics of the ``"sparse_verify"`` attention (``j > i - window``) and of transformers' sliding
masks, so the window is passed as ``sliding_window``. SDPA ignores that argument (transformers builds sliding
masks instead, which GPT-Neo's model does not), so under ``"sdpa"`` the window is applied to the mask here.

Precision: the original computes ``q k^T`` and the softmax in float32 whatever the model's dtype; the attention
function here computes in the model's dtype (identical for float32 models).
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .gptj import _no_eager

#: attention classes of ``transformers.models.gpt_neo.modeling_gpt_neo`` this module stands in for (the
#: flash-attention class only overrides ``forward``)
REPLACEABLE = frozenset({"GPTNeoSelfAttention", "GPTNeoFlashAttention2"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a GPT-Neo self-attention module (`REPLACEABLE`)."""
    return type(module).__name__ in REPLACEABLE


def windowed_mask(mask: torch.Tensor | None, window: int, q_len: int, kv_len: int, device) -> torch.Tensor:
    """GPT-Neo's local mask on top of ``mask`` (an SDPA mask ``[B, 1, q, L]``, boolean or additive, or None for a
    plain causal one): the query at cache index ``i = L - q + t`` keeps the slots ``i - window < j <= i``."""
    i = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]  # [q, 1]
    j = torch.arange(kv_len, device=device)  # [L]
    band = (j <= i) & (j > i - window)  # [q, L]
    if mask is None:
        return band[None, None]
    if mask.dtype == torch.bool:
        return mask & band
    return mask.masked_fill(~band, torch.finfo(mask.dtype).min)


class GPTNeoAttentionDispatch(torch.nn.Module):
    """Stand-in for a ``GPTNeoSelfAttention``, sharing its projections (no weight copied).

    The attributes attention functions read from their ``module`` argument are set: ``layer_idx`` (the original's
    ``layer_id``), ``config``, ``is_causal``, ``head_dim``, ``scaling``, ``num_key_value_groups``.

    Args:
        original: a module for which `replaceable_attention` holds.
        config: unused (the original keeps its own config); accepted for `ATTENTION_REPLACEMENTS`' signature.
    """

    reads = ("q_proj", "k_proj", "v_proj", "out_proj", "config", "layer_id", "attention_type")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not one of {sorted(REPLACEABLE)}; leave it in place"
            )
        self.q_proj, self.k_proj, self.v_proj = original.q_proj, original.k_proj, original.v_proj
        self.out_proj = original.out_proj
        self.config = original.config
        self.layer_idx = original.layer_id
        self.num_heads = original.num_heads
        self.head_dim = original.head_dim
        self.num_key_value_groups = 1
        self.scaling = 1.0  # GPT-Neo does not scale q k^T
        self.is_causal = True
        local = original.attention_type == "local"
        self.sliding_window = original.config.window_size if local else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layer_past=None,
        use_cache: bool = False,
        output_attentions: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments ``GPTNeoAttention`` passes: ``hidden_states`` ``[B, T, hidden]``, the model's
        ``attention_mask`` (passed on to the attention function), ``layer_past`` (the cache). Returns
        ``[B, T, hidden]`` and no attention weights."""
        batch, length, _ = hidden_states.shape
        shape = (batch, length, self.num_heads, self.head_dim)
        # [B, H, T, D]
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        implementation = self.config._attn_implementation
        if self.sliding_window and implementation == "sdpa":
            attention_mask = windowed_mask(
                attention_mask, self.sliding_window, length, key.shape[-2], hidden_states.device
            )
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, _no_eager)
        # out [B, T, H, D]; attention dropout is off in eval mode (our attention refuses training mode)
        out, _ = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            sliding_window=self.sliding_window,
            **kwargs,
        )
        return self.out_proj(out.reshape(batch, length, self.num_heads * self.head_dim)), None
