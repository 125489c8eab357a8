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
from .eager import LogitMods

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
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature; ``query`` ``[B, H, q, D]``, ``key``/``value`` the cache buffers.

    ``softcap`` (logit soft-capping, Gemma 2 / Cohere 2) and ``s_aux`` (``[H]`` attention-sink logits, GPT-OSS) are
    honoured; a value head size other than the key's (multi-head latent attention) is too.
    """
    step = current_step()
    if dropout and module.training:
        raise NotImplementedError("attention dropout in training mode is not supported; call model.eval()")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    sliding_window = _compat.layer_sliding_window(module, sliding_window)
    view = step.on(query.device)
    mods = LogitMods(softcap=softcap or None, sinks=s_aux)
    sparsity = step.sparsity()  # lossy block-sparse verify (plain full-attention layers only)
    if sparsity is not None and mods.plain and not sliding_window and key.shape[-1] == value.shape[-1]:
        out = sparsity.attend(module, query, key, value, view, scaling)
        if out is not None:
            return out, None
    out = get_backend(step.backend)(
        module, query, key, value, view, scaling=scaling, sliding_window=sliding_window, mods=mods
    )
    return out, None


def sparse_verify_mask(*args, **kwargs) -> None:
    """Mask function for `AttentionMaskInterface`: the attention builds its masks from the step's per-row slots,
    so transformers has nothing to build."""
    return None


def register() -> None:
    """Register the attention and mask functions under ``"sparse_verify"`` (idempotent)."""
    AttentionInterface.register(NAME, sparse_verify_attention)
    AttentionMaskInterface.register(NAME, sparse_verify_mask)
