"""`GPTJAttentionDispatch`: GPT-J's self-attention, dispatched through transformers' `AttentionInterface`.

transformers' ``GPTJAttention.forward`` runs its own ``_attn`` (or flash attention) instead of
``ALL_ATTENTION_FUNCTIONS.get_interface(...)``. For the duration of a call
(`hf_sparse_verify.integrations.speculation_mode`) each one is replaced by this module, which shares the
original's ``q_proj``/``k_proj``/``v_proj``/``out_proj`` and its sinusoid table ``embed_positions`` and computes
what the original computes up to the attention: the projections, GPT-J's interleaved rotary embedding
(``rotate_every_two``) over the first ``rotary_dim`` features of each head (all of them when ``rotary_dim`` is None),
with sin/cos gathered from the table at ``position_ids``; the cache update; then the registered attention function
with scale ``1 / sqrt(head_dim)`` and ``out_proj``. Checked against transformers 5.23.0.

Precision: the original computes ``q @ k^T`` and the softmax in float32 whatever the model's dtype; the attention
function here computes in the model's dtype (identical for float32 models).
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

#: attention classes of ``transformers.models.gptj.modeling_gptj`` this module stands in for (the flash-attention
#: class only overrides ``forward``)
REPLACEABLE = frozenset({"GPTJAttention", "GPTJFlashAttention2"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a GPT-J attention module (`REPLACEABLE`) that runs its own attention: one that keeps
    its sinusoid table ``embed_positions`` (transformers < 5.24; from 5.24 the module takes the model's rotary
    embedding and dispatches through `AttentionInterface` itself, so it needs no stand-in)."""
    return type(module).__name__ in REPLACEABLE and hasattr(module, "embed_positions")


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)`` over the last dimension."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rotary_every_two(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, rotary_dim: int | None):
    """GPT-J's (and CodeGen's) rotary embedding of ``x`` ``[B, T, H, D]``: the pairs ``(2i, 2i + 1)`` of the first
    ``rotary_dim`` features (all ``D`` when None) rotate by the angles whose ``sin``/``cos`` ``[B, T, rotary_dim / 2]``
    are given; the other features pass through."""
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)  # [B, T, 1, rotary_dim]
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    rotary_dim = rotary_dim or x.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((rot * cos + _rotate_every_two(rot) * sin, rest), dim=-1)


def sin_cos(table: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sin``, ``cos`` ``[B, T, rotary_dim / 2]`` at ``position_ids`` ``[B, T]`` from a ``create_sinusoidal_positions``
    table ``[max_positions, rotary_dim]`` (sines, then cosines)."""
    sincos = table.to(position_ids.device)[position_ids]
    return sincos.chunk(2, dim=-1)


def _no_eager(*args, **kwargs):
    raise NotImplementedError(
        "this attention replacement runs a registered attention function (e.g. 'sparse_verify' or 'sdpa'), not "
        "'eager'; it is only swapped in by hf_sparse_verify for the duration of a call"
    )


class GPTJAttentionDispatch(torch.nn.Module):
    """Stand-in for a ``GPTJAttention``, sharing its projections and ``embed_positions`` (no weight copied).

    The attributes attention functions read from their ``module`` argument are set: ``layer_idx``, ``config``,
    ``is_causal``, ``head_dim``, ``scaling``, ``num_key_value_groups`` (``training`` comes with `torch.nn.Module`).

    Args:
        original: a module for which `replaceable_attention` holds.
        config: unused (the original keeps its own config); accepted for `ATTENTION_REPLACEMENTS`' signature.
    """

    reads = ("q_proj", "k_proj", "v_proj", "out_proj", "embed_positions", "config", "layer_idx", "rotary_dim")

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not one of {sorted(REPLACEABLE)}; leave it in place"
            )
        self.q_proj, self.k_proj, self.v_proj = original.q_proj, original.k_proj, original.v_proj
        self.out_proj = original.out_proj
        self.embed_positions = original.embed_positions  # [max_positions, rotary_dim]: sines, then cosines
        self.config = original.config
        self.layer_idx = original.layer_idx
        self.rotary_dim = original.rotary_dim
        self.num_heads = original.num_attention_heads
        self.head_dim = original.head_dim
        self.num_key_value_groups = 1
        self.scaling = self.head_dim**-0.5  # the original divides by scale_attn = sqrt(head_dim)
        self.is_causal = True

    def _project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query, key and value ``[B, T, H, D]``."""
        shape = (*hidden_states.shape[:-1], self.num_heads, self.head_dim)
        return (
            self.q_proj(hidden_states).view(shape),
            self.k_proj(hidden_states).view(shape),
            self.v_proj(hidden_states).view(shape),
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        layer_past=None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments the decoder block passes: ``hidden_states`` ``[B, T, hidden]``, ``layer_past`` (the cache),
        the model's ``attention_mask`` (passed on to the attention function), ``position_ids`` ``[B, T]``. Returns
        ``[B, T, hidden]`` and no attention weights."""
        batch, length, _ = hidden_states.shape
        query, key, value = self._project(hidden_states)  # [B, T, H, D]
        sin, cos = sin_cos(self.embed_positions, position_ids)
        query, key = self._rotate(query, key, sin, cos, hidden_states.dtype)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, H, T, D]
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _no_eager)
        # out [B, T, H, D]; attention dropout is off in eval mode (our attention refuses training mode)
        out, _ = attention(
            self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs
        )
        return self.out_proj(out.reshape(batch, length, self.num_heads * self.head_dim)), None

    def _rotate(self, query, key, sin, cos, dtype):
        """GPT-J casts sin/cos to the key's dtype before rotating."""
        sin, cos = sin.to(key.dtype), cos.to(key.dtype)
        return (
            apply_rotary_every_two(query, sin, cos, self.rotary_dim),
            apply_rotary_every_two(key, sin, cos, self.rotary_dim),
        )
