"""`SparseMLAAttention`: DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-MoE-DSA) computed in MLA's latent space, so a
step reads only the latent rows its queries' indexers selected.

transformers' attention of these models expands the whole latent cache through ``kv_b_proj`` into per-head keys and
values at every step (``[B, H, L, 192 + 128]`` for all ``L`` cached tokens) and then masks all but each query's
top-k. For the duration of a call (`hf_sparse_verify.integrations.speculation_mode`) each such module is replaced by
this one, which shares the original's projections, norms and indexer (no weight copied) and computes what it
computes in the absorbed form: the query's non-rotary part taken through ``W_UK`` (the key half of ``kv_b_proj``),
logits against the cached latent and rotary rows of the selected slots, the softmax-weighted latent rows taken
through ``W_UV`` (the value half), then ``o_proj`` (`hf_sparse_verify.kernels.sparse_mla`). A verify step's queries
share one read of the union of their selections (the merged schedule, papers/003), each query still attending to
exactly its own top-k, so greedy output equals plain ``generate``. The indexer's projections, key cache, masking
and top-k are the model's own; its scores come from `hsv::index_scores` (`kernels.index_scores`: no float32 copy of
the cached keys, no per-head score tensor) where `_compat.indexer_rotary` knows the indexer's rotary. Prefill
chunks (more than `MAX_MERGED_QUERIES` queries) expand the read slots through transformers' own ``expand_kv``
instead: there the absorbed form would cost more arithmetic (576 + 512 channels per head and slot against 192 +
128).

Precision: the same sums in another order (``q (W_UK c)`` against ``(q W_UK) c``), logits and softmax in float32 as
transformers' eager attention computes its softmax. Checked against transformers 5.24.0.
"""

from __future__ import annotations

import torch

from .. import _compat
from ..kernels.index_scores import index_scores
from ..kernels.sparse_mla import MAX_MERGED_QUERIES, selected_attention_expanded, selection_mask, sparse_mla
from ..placement import dtensor_weights

#: attention classes this module stands in for, and whether the class returns its top-k indices too (GLM-MoE-DSA's
#: layers hand them to the next layer, whose ``"shared"`` indexer reuses them)
REPLACEABLE = {"DeepseekV32Attention": False, "GlmMoeDsaAttention": True}


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a DSA attention over an MLA cache whose ``kv_b_proj`` is a plain linear layer with a
    whole weight (not sharded by tensor parallelism: such models keep transformers' path)."""
    return (
        type(module).__name__ in REPLACEABLE
        and type(getattr(module, "kv_b_proj", None)) is torch.nn.Linear
        and not dtensor_weights(module.kv_b_proj)
        and getattr(module, "q_a_proj", None) is not None
    )


class SparseMLAAttention(torch.nn.Module):
    """Stand-in for a DSA attention module (`REPLACEABLE`), sharing its submodules.

    Args:
        original: a module for which `replaceable_attention` holds.
        config: unused (the original's is kept); accepted for `ATTENTION_REPLACEMENTS`' signature.
    """

    reads = (
        "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj",
        "indexer", "num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "scaling",
        "layer_idx",
    )  # fmt: skip

    def __init__(self, original: torch.nn.Module, config=None):
        super().__init__()
        if not replaceable_attention(original):
            raise ValueError(
                f"{type(original).__name__} is not a replaceable DSA attention; leave it in place"
            )
        for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                     "o_proj", "indexer"):  # fmt: skip
            setattr(self, name, getattr(original, name))
        self.returns_indices = REPLACEABLE[type(original).__name__]
        self.rotary = _compat.mla_rotary(original)
        # the indexer's scores through `hsv::index_scores` where its rotary is known (else its own forward)
        self.indexer_rotary = None if self.indexer is None else _compat.indexer_rotary(self.indexer)
        self.expand_kv = original.expand_kv  # transformers' own expansion, for prefill chunks
        self.layer_idx = original.layer_idx
        self.num_heads = original.num_heads
        self.nope, self.rope = original.qk_nope_head_dim, original.qk_rope_head_dim
        self.v_head_dim, self.rank = original.v_head_dim, original.kv_lora_rank
        self.scaling = original.scaling
        self.config = getattr(original, "config", None)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        cache=None,
        position_ids: torch.Tensor | None = None,
        prev_topk_indices: torch.Tensor | None = None,
        past_key_values=None,
        **kwargs,
    ):
        """The arguments the models' decoder layers pass. Returns ``(output, None)``, and the layer's top-k indices
        as a third item where the original does (GLM-MoE-DSA)."""
        cache = cache if cache is not None else past_key_values
        batch, length = hidden_states.shape[:2]
        heads = self.num_heads
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        query = self.q_b_proj(q_resid).view(batch, length, heads, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rot = torch.split(query, [self.nope, self.rope], dim=-1)  # [B, H, q, .]
        kv_pass, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [self.rank, self.rope], dim=-1)
        latent = self.kv_a_layernorm(kv_pass).view(batch, 1, length, self.rank)
        k_rot = k_rot.view(batch, 1, length, self.rope)
        cos, sin = position_embeddings
        q_rot, k_rot = self.rotary(q_rot, k_rot, cos, sin)
        if cache is not None:
            latent, k_rot = cache.update(latent, k_rot, self.layer_idx)
        if self.indexer_rotary is not None:
            indices = self._select(hidden_states, q_resid, cos, sin, attention_mask[:, 0], cache)  # [B, q, top-k]
        elif self.indexer is not None:
            indices = self.indexer(
                hidden_states, q_resid, position_embeddings, attention_mask[:, 0], position_ids, cache=cache
            )
        elif prev_topk_indices is not None:
            indices = prev_topk_indices
        else:
            raise ValueError("a shared DSA layer needs the top-k indices of the full indexer layer before it")
        mask = attention_mask[:, 0]  # [B, q, L]
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        if length > MAX_MERGED_QUERIES:  # a prefill chunk: expand the read slots once, as transformers does
            kv_len = allowed.shape[-1]
            key, value = self.expand_kv(latent[:, :, :kv_len], k_rot[:, :, :kv_len])
            attend = selection_mask(indices, allowed)
            out = selected_attention_expanded(
                torch.cat([q_nope, q_rot], dim=-1), key, value, attend, self.scaling
            )
        else:  # decode and verify steps: absorbed, the selected latent rows only
            weight = self.kv_b_proj.weight.view(heads, self.nope + self.v_head_dim, self.rank)
            q_lat = torch.einsum(
                "bhqn,hnr->bqhr", q_nope, weight[:, : self.nope]
            ).contiguous()  # [B, q, H, R]
            q_rot = q_rot.transpose(1, 2).contiguous()
            out = sparse_mla(q_lat, q_rot, latent[:, 0], k_rot[:, 0], indices, allowed, self.scaling)
            out = torch.einsum("bqhr,hvr->bqhv", out, weight[:, self.nope :])
        out = self.o_proj(out.reshape(batch, length, heads * self.v_head_dim))
        return (out, None, indices) if self.returns_indices else (out, None)

    def _select(self, hidden_states, q_resid, cos, sin, mask, cache) -> torch.Tensor:
        """The indexer's top-k, as its forward computes it (transformers 5.24.0: projections, norm and rotary of the
        shared indexer module, the key cache's ``update_indexer``, the same masking and ``topk``) with the scores
        from `hsv::index_scores`, which reads the cached keys in their own dtype once instead of copying them to
        float32 and materialising ``[B, q, H, L]`` per-head scores. int32 ``[B, q, top-k]``."""
        ix = self.indexer
        batch, length = hidden_states.shape[:2]
        split = [ix.qk_rope_head_dim, ix.head_dim - ix.qk_rope_head_dim]
        q_rot, q_pass = torch.split(ix.wq_b(q_resid).view(batch, length, ix.n_heads, ix.head_dim), split, dim=-1)
        k_rot, k_pass = torch.split(ix.k_norm(ix.wk(hidden_states)).unsqueeze(2), split, dim=-1)
        q_rot, k_rot = self.indexer_rotary(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)  # [B, q, H, D]
        keys = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)  # [B, q, D]
        if cache is not None:
            keys = cache.update_indexer(keys, ix.layer_idx)  # [B, L, D]
        weights = ix.weights_proj(hidden_states.to(ix.weights_proj.weight.dtype)).float() * ix.n_heads**-0.5
        if keys.dtype != q.dtype:  # transformers scores in float32: a mixed pair is upcast, never rounded down
            q, keys = q.float(), keys.float()
        scores = index_scores(q, keys, weights, ix.softmax_scale)  # [B, q, L] float32
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
        return scores.topk(min(ix.index_topk, scores.shape[-1]), dim=-1).indices.to(torch.int32)
