"""`FusedQKVAttention`: the Llama-family self-attention with its input side fused for decode and verify steps.

transformers' ``LlamaAttention.forward`` (and Mistral's, Mixtral's, Qwen2's, Qwen2-MoE's, Qwen3's, Qwen3-MoE's) runs
``q_proj``, ``k_proj``, ``v_proj`` as three GEMMs (with cuBLAS split-K reductions at one row), Qwen3's per-head
``q_norm`` / ``k_norm``, and ``apply_rotary_pos_emb`` as about eight elementwise and ``cat`` kernels, before the cache
update and the registered attention function. This module computes the same thing, sharing the original's
projections and norms (no weight copied), with two launches on CUDA (`hf_sparse_verify.kernels.qkv_rope`): the
three projections in one pass over their weights (steps of at most `MAX_ROWS` token rows; larger steps use
``F.linear``), and norm + rotary of every query and key head in one kernel (which also writes the step's keys and
values into our `SpecCache`, `SpecLayer.direct_write_slots`, instead of a cache-write launch); ``o_proj`` of such steps is one Triton
launch (`row_linear`, `TRITON_O_PROJ`) instead of cuBLAS split-K plus a reduction, which cannot overlap their
neighbours through programmatic dependent launch. Elsewhere (CPU, no Triton) it runs the
original arithmetic op by op, so CPU results are bitwise what transformers computes. The cache update (other caches)
and the attention function (``config._attn_implementation`` through `AttentionInterface`) are as in the original.

What the originals pass to the attention function differs by class (checked against transformers 5.23.0's source):
`SLIDING_WINDOW` says where each reads ``sliding_window`` from, or that it passes none. Only these classes, with full
rotary embeddings (``cos`` as wide as a head) and one dtype for activations, norm weights and ``cos``/``sin``, take
the fused path; other inputs run the original arithmetic.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..attention.cache import SpecCache
from ..kernels._triton import compiled_on
from ..kernels.qkv_rope import MAX_ROWS, qkv_proj, rope_qk, rope_qk_cache, row_linear
from ..kernels.qkv_rope.naive import rotate_half
from ..kernels.qkv_rope.tiles import linear_block_n, proj_block_n
from .gptj import _no_eager
from .low_bit_linear import LOW_BIT_LAYERS, stacked_whole

#: ``o_proj`` of fused steps on the Triton `row_linear` (one launch, overlapping its neighbours through programmatic
#: dependent launch) rather than ``nn.Linear`` (cuBLAS split-K + reduction); benchmarks switch it for A/B runs
TRITON_O_PROJ = True
#: fused steps on our `SpecCache` write their keys and values in the rotary launch (`rope_qk_cache`) rather than in a
#: cache-write launch of their own; benchmarks switch it for A/B runs
DIRECT_CACHE_WRITE = True

#: attention class -> where its forward reads the ``sliding_window`` it passes to the attention function: ``"module"``
#: (its own ``sliding_window`` attribute), ``"config"`` (``getattr(config, "sliding_window", None)``) or None (passes
#: none)
SLIDING_WINDOW = {
    "LlamaAttention": None,
    "MistralAttention": "config",
    "MixtralAttention": "config",
    "Qwen2Attention": "module",
    "Qwen2MoeAttention": None,
    "Qwen3Attention": "module",
    "Qwen3MoeAttention": "module",
}
#: attention classes whose forward is the Llama one described above (plus the ``sliding_window`` of `SLIDING_WINDOW`,
#: and the per-head ``q_norm`` / ``k_norm`` RMSNorms of the Qwen3 classes)
REPLACEABLE = frozenset(SLIDING_WINDOW)
_QK_NORM = frozenset({"Qwen3Attention", "Qwen3MoeAttention"})


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether `FusedQKVAttention` computes what ``module`` computes: an allow-listed class whose four projections
    are all ``nn.Linear`` or all low-bit (`LowBitLinear` or `LowBitRows`: a low-bit draft copy's; biases on all of
    q/k/v or none) and, for the Qwen3 classes, RMSNorms with ``variance_epsilon``."""
    name = type(module).__name__
    if name not in REPLACEABLE:
        return False
    projections = [getattr(module, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    kinds = {type(p) for p in projections}
    if kinds != {torch.nn.Linear} and not kinds <= set(LOW_BIT_LAYERS):
        return False
    if len({p.bias is None for p in projections[:3]}) != 1:
        return False
    if name in _QK_NORM:
        norms = (getattr(module, "q_norm", None), getattr(module, "k_norm", None))
        return all(hasattr(n, "weight") and hasattr(n, "variance_epsilon") for n in norms)
    return True


class FusedQKVAttention(torch.nn.Module):
    """Stand-in for a Llama-family attention module (`REPLACEABLE`), sharing its projections and norms.

    The attributes attention functions read from their ``module`` argument are the original's: ``layer_idx``,
    ``config``, ``is_causal``, ``head_dim``, ``scaling``, ``num_key_value_groups``, ``attention_dropout`` (and
    ``training`` from `torch.nn.Module`).

    Args:
        original: a module for which `replaceable_attention` holds.
    """

    reads = (
        "q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "config", "layer_idx", "head_dim", "scaling",
        "num_key_value_groups", "is_causal", "attention_dropout", "sliding_window",
    )  # fmt: skip

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not a Llama-family attention of {sorted(REPLACEABLE)} with Linear "
                "projections; leave it in place"
            )
        name = type(original).__name__
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            original.q_proj, original.k_proj, original.v_proj, original.o_proj,
        )  # fmt: skip
        self.q_norm = original.q_norm if name in _QK_NORM else None
        self.k_norm = original.k_norm if name in _QK_NORM else None
        self.config = original.config
        self.layer_idx = original.layer_idx
        self.head_dim = original.head_dim
        self.scaling = original.scaling
        self.num_key_value_groups = original.num_key_value_groups
        self.is_causal = original.is_causal
        self.attention_dropout = original.attention_dropout
        source = SLIDING_WINDOW[name]
        if source == "module":
            self.sliding_window = getattr(original, "sliding_window", None)
        elif source == "config":
            self.sliding_window = getattr(original.config, "sliding_window", None)
        self._passes_window = source is not None
        # a low-bit draft copy's projections run the low-bit matmul (one launch each); the rotary, cache-write and
        # output paths are the same as for the model's own weights
        self.low_bit = isinstance(self.q_proj, LOW_BIT_LAYERS)
        # a copy that stacks q / k / v (`low_bit_copy`): one launch for the three
        self._qkv = stacked_whole([self.q_proj, self.k_proj, self.v_proj]) if self.low_bit else None
        self._qkv_sizes = [p.out_features for p in (self.q_proj, self.k_proj, self.v_proj)]
        self._block_n = proj_block_n(self.q_proj.out_features, self.k_proj.out_features)
        self._out_block_n = linear_block_n(self.o_proj.out_features)

    def _fused(self, hidden_states: torch.Tensor, cos: torch.Tensor) -> bool:
        """Whether this call takes the Triton path (CUDA with Triton, full rotary, one dtype throughout)."""
        if not compiled_on(hidden_states.device):
            return False
        dtype = hidden_states.dtype
        weights = [cos] if self.low_bit else [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, cos]
        weights += [n.weight for n in (self.q_norm, self.k_norm) if n is not None]
        return cos.shape[-1] == self.head_dim and all(w.dtype == dtype for w in weights)

    def _project_fused(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layer=None, slots=None):
        """``x`` ``[T, H]`` rows -> q ``[T, Hq, D]``, k ``[T, Hkv, D]`` (normed, rotated), v ``[T, Hkv * D]``; with
        a cache ``layer`` and its ``slots`` (`SpecLayer.direct_write_slots`), k and v go into the layer's buffers in
        the rotary launch and its ``keys`` / ``values`` come back instead."""
        biases = (self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)
        if x.shape[0] <= MAX_ROWS and self._block_n is not None and not self.low_bit:
            q, k, v = qkv_proj(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, *biases)
        elif self._qkv is not None:
            # a stacked low-bit q / k / v: views of one [T, q + k + v] output (the rotary kernels take row strides)
            q, k, v = self._qkv(x).split(self._qkv_sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        norms = [n.weight if n is not None else None for n in (self.q_norm, self.k_norm)]
        eps = self.q_norm.variance_epsilon if self.q_norm is not None else 1e-6
        if slots is not None:
            q = rope_qk_cache(q, k, v, cos, sin, self.head_dim, *norms, eps, layer.keys, layer.values, slots)
            return q, layer.keys, layer.values
        q, k = rope_qk(q, k, cos, sin, self.head_dim, norms[0], norms[1], eps)
        return q, k, v

    def _direct_cache(self, cache, batch: int, length: int, dtype: torch.dtype):
        """``(layer, slots)`` when ``cache`` is our `SpecCache` and this step may write its layer directly (see
        `SpecLayer.direct_write_slots`), else ``(None, None)``."""
        if not DIRECT_CACHE_WRITE or not isinstance(cache, SpecCache) or self.layer_idx >= len(cache.layers):
            return None, None
        layer = cache.layers[self.layer_idx]
        slots = layer.direct_write_slots(batch, length, dtype)
        return (layer, slots) if slots is not None else (None, None)

    def _project_eager(self, hidden_states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The original arithmetic: ``[B, H, T, D]`` queries, keys and values."""
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin), v

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        cache=None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        """The arguments the decoder layer passes: ``hidden_states`` ``[B, T, hidden]``, ``position_embeddings``
        (``cos``, ``sin`` ``[B, T, D]``), the model's ``attention_mask`` and cache; the rest go to the attention
        function. Returns ``[B, T, hidden]`` and the attention function's weights."""
        batch, length, _ = hidden_states.shape
        cos, sin = position_embeddings
        fused = self._fused(hidden_states, cos)
        cache = cache if cache is not None else past_key_values  # its name from transformers 5.24 / before
        layer, slots = (
            self._direct_cache(cache, batch, length, hidden_states.dtype) if fused else (None, None)
        )
        if fused:
            rows = hidden_states.reshape(batch * length, -1)
            # cos / sin are [1, T, D] when the model made its own position ids: one row of them per token
            cos, sin = (t.expand(batch, length, -1).reshape(batch * length, -1) for t in (cos, sin))
            q, k, v = self._project_fused(rows, cos, sin, layer, slots)
            q = q.view(batch, length, -1, self.head_dim).transpose(1, 2)  # [B, Hq, T, D]
            if slots is None:
                k = k.view(batch, length, -1, self.head_dim).transpose(1, 2)
                v = v.view(batch, length, -1, self.head_dim).transpose(1, 2)
        else:
            q, k, v = self._project_eager(hidden_states, cos, sin)
        if cache is not None and slots is None:
            k, v = cache.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _no_eager)
        if self._passes_window:
            kwargs["sliding_window"] = self.sliding_window
        out, weights = attention(
            self, q, k, v, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs,
        )  # fmt: skip
        out = out.reshape(batch, length, -1).contiguous()
        rows = batch * length
        if (
            fused
            and TRITON_O_PROJ
            and not self.low_bit
            and rows <= MAX_ROWS
            and self._out_block_n is not None
            and self.o_proj.weight.dtype == out.dtype
        ):
            projected = row_linear(out.view(rows, -1), self.o_proj.weight, self.o_proj.bias)
            return projected.view(batch, length, -1), weights
        return self.o_proj(out), weights
