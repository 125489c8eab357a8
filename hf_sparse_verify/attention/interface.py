"""The ``"sparse_verify"`` attention implementation, registered with transformers' `AttentionInterface` and
`AttentionMaskInterface` (`hf_sparse_verify.integrations.speculation_mode` switches a model to it for a call).

The attention reads the running step from :func:`hf_sparse_verify.step.current_step`; masking comes from the step,
so the registered mask function returns None.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .. import _compat
from ..step import current_step
from . import eager as _eager  # noqa: F401 - registers the "reference" (eager) backend
from . import token_sparse as _token_sparse  # noqa: F401 - registers the "token_sparse" backend
from . import triton_backend as _triton_backend  # noqa: F401 - registers the "triton" backend
from .dispatch import get_backend
from .eager import ROW_CHUNK, LogitMods, _attention_with_logits

NAME = "sparse_verify"


def sparse_verify_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature; ``query`` ``[B, H, q, D]``, ``key``/``value`` the cache buffers.

    ``softcap`` (logit soft-capping, Gemma 2 / Cohere 2) and ``s_aux`` (``[H]`` attention-sink logits, GPT-OSS) are
    honoured, and so are ``alibi_slopes`` (``[H]`` ALiBi slopes, passed by our BLOOM and MPT replacements) and
    ``indices`` (``[B, q, top-k]`` cache slots a DSA indexer chose for each query, `selected_attention`); a value
    head size other than the key's (multi-head latent attention) is too.
    """
    step = current_step()
    if dropout and module.training:
        raise NotImplementedError("attention dropout in training mode is not supported; call model.eval()")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sliding_window = _compat.layer_sliding_window(module, sliding_window)
    view = step.on(query.device)
    mods = LogitMods(softcap=softcap or None, sinks=s_aux, alibi=alibi_slopes)
    if indices is not None:  # a sparse-attention indexer's top-k slots per query (DSA)
        return selected_attention(query, key, value, view, indices, scaling, sliding_window, mods), None
    sparsity = step.sparsity()  # lossy block-sparse verify (plain full-attention layers only)
    if sparsity is not None and mods.plain and not sliding_window and key.shape[-1] == value.shape[-1]:
        out = sparsity.attend(module, query, key, value, view, scaling)
        if out is not None:
            return out, None
    out = get_backend(step.backend)(
        module, query, key, value, view, scaling=scaling, sliding_window=sliding_window, mods=mods
    )
    return out, None


def selected_attention(query, key, value, view, indices, scaling, sliding_window, mods) -> torch.Tensor:
    """Attention of each query over the cache slots its indexer selected (``indices`` ``[B, q, k]``, slots below
    the step's ``kv_len``), within the step's mask: DeepSeek Sparse Attention as transformers' eager path runs it,
    each verify token with its own selection, so output equals plain ``generate``. Explicit logits, in blocks of
    query rows. Returns ``[B, q, H, D_v]``."""
    step = view.step
    key, value = key[:, :, : step.kv_len], value[:, :, : step.kv_len]
    chosen = torch.zeros(*indices.shape[:2], step.kv_len, dtype=torch.bool, device=query.device)
    chosen.scatter_(-1, indices.long().clamp(0, step.kv_len - 1), True)
    mask = view.mask(sliding_window) & chosen[:, None]  # [B, 1, q, L]
    rows = range(0, query.shape[2], ROW_CHUNK)
    out = torch.cat(
        [
            _attention_with_logits(
                query[:, :, i : i + ROW_CHUNK], key, value, mask[:, :, i : i + ROW_CHUNK], scaling, mods
            )[0]
            for i in rows
        ],
        dim=2,
    )
    return out.transpose(1, 2).contiguous()


def sparse_verify_mask(*args, config=None, device=None, **kwargs) -> torch.Tensor | None:
    """Mask function for `AttentionMaskInterface`: the attention builds its masks from the step's per-row slots,
    so transformers has nothing to build (None); for models whose forward converts the mask before its layers
    (`_compat.MASK_TENSOR_MODEL_TYPES`), an all-False ``[1, 1, 1, 1]`` boolean tensor nothing reads; for models with
    a DSA indexer, which masks its scores itself, the step's boolean ``[B, 1, q, kv_len]`` mask."""
    if getattr(config, "model_type", None) in _compat.MASK_TENSOR_MODEL_TYPES:
        return torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=device)
    if _compat.indexed_attention(config):  # a DSA indexer masks its scores with it: the step's own mask
        step = current_step(required=False)
        if step is not None:
            return step.on(device).mask(None)
    return None


def register() -> None:
    """Register the attention and mask functions under ``"sparse_verify"`` (idempotent)."""
    AttentionInterface.register(NAME, sparse_verify_attention)
    AttentionMaskInterface.register(NAME, sparse_verify_mask)
