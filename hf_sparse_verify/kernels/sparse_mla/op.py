"""Public sparse MLA attention op, registered as ``hsv::sparse_mla`` (opaque to graph capture): the merged schedule
and the Triton kernel where Triton runs and the step has at most `naive.MAX_MERGED_QUERIES` queries, the dense
reference elsewhere (prefill chunks, CPUs without the interpreter)."""

from __future__ import annotations

import torch

from .._triton import triton_runs_on
from .naive import MAX_MERGED_QUERIES, merged_selection, per_query_selection, selection_mask, sparse_mla_naive

#: how a step's queries read their selections: ``"per_query"`` (each its own top-k) or ``"merged"`` (the union once
#: per head block, a bit per query; papers/003). Per query is the default: on a DeepSeek-V3.2 layer (one H100, 1 x 16K,
#: 8 queries) absorbed MLA is near the compute ridge (128 heads per 1,152-byte row), and the merged schedule computes
#: every query's logits over the whole union (5.2x one top-k with random weights, 2.6x on trained weights), so it
#: read fewer bytes but took longer (179-261 us against 115-120 us; `benchmarks/results/dsa.json`).
SCHEDULES = ("per_query", "merged")

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@torch.library.custom_op("hsv::sparse_mla", mutates_args=())
def _sparse_mla_op(
    q_lat: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, rot: torch.Tensor, indices: torch.Tensor,
    allowed: torch.Tensor, scaling: float, schedule: str,
) -> torch.Tensor:  # fmt: skip
    if triton_runs_on(q_lat.device) and q_lat.shape[1] <= MAX_MERGED_QUERIES:
        from .kernel import sparse_mla_triton

        batch, q_len = q_lat.shape[:2]
        if schedule == "merged" and q_len > 1:
            slots, bits, count = merged_selection(indices, allowed)
            return sparse_mla_triton(q_lat, q_rot, latent, rot, slots, bits, count, scaling)
        slots, bits, count = per_query_selection(indices, allowed)
        flat = (t.reshape(batch * q_len, 1, *t.shape[2:]) for t in (q_lat, q_rot))
        out = sparse_mla_triton(*flat, latent, rot, slots, bits, count, scaling, kv_share=q_len)
        return out.view(q_lat.shape)
    return sparse_mla_naive(q_lat, q_rot, latent, rot, selection_mask(indices, allowed), scaling)


@_sparse_mla_op.register_fake
def _(q_lat, q_rot, latent, rot, indices, allowed, scaling, schedule):
    return torch.empty_like(q_lat)


def sparse_mla(
    q_lat: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor, rot: torch.Tensor, indices: torch.Tensor,
    allowed: torch.Tensor, scaling: float, schedule: str = "per_query",
) -> torch.Tensor:  # fmt: skip
    """Absorbed MLA attention of each query over the cache slots its DSA indexer selected.

    Args:
        q_lat: ``[B, q, H, R]`` queries taken into the latent space (``q_nope W_UK``).
        q_rot: ``[B, q, H, P]`` rotary query parts.
        latent: ``[B, C, R]`` the cache's latent rows (``C >= L``; any strides).
        rot: ``[B, C, P]`` the cache's rotary key rows.
        indices: ``[B, q, k]`` the slots each query's indexer chose (int32 or int64).
        allowed: ``[B, q, L]`` bool, the step's mask (``L`` slots read).
        scaling: logit scale.
        schedule: `SCHEDULES`: each query over its own selection, or the union of the step's selections once.

    Returns ``[B, q, H, R]`` in ``q_lat.dtype``: each query's softmax-weighted sum of the latent rows it selected.
    """
    if q_lat.dim() != 4 or q_rot.dim() != 4 or q_lat.shape[:3] != q_rot.shape[:3]:
        raise ValueError(
            f"q_lat and q_rot must be [B, q, H, R] and [B, q, H, P]; got {tuple(q_lat.shape)}, {tuple(q_rot.shape)}"
        )
    batch, q_len = q_lat.shape[:2]
    if latent.dim() != 3 or rot.dim() != 3 or latent.shape[:2] != rot.shape[:2] or latent.shape[0] != batch:
        raise ValueError(
            f"latent and rot must be [B={batch}, C, R] and [B, C, P]; got {tuple(latent.shape)}, {tuple(rot.shape)}"
        )
    if latent.shape[-1] != q_lat.shape[-1] or rot.shape[-1] != q_rot.shape[-1]:
        raise ValueError(
            f"latent/rot widths {latent.shape[-1]}/{rot.shape[-1]} must match q_lat/q_rot {q_lat.shape[-1]}/"
            f"{q_rot.shape[-1]}"
        )
    if q_lat.dtype not in _FLOATS or any(t.dtype != q_lat.dtype for t in (q_rot, latent, rot)):
        raise ValueError("q_lat, q_rot, latent and rot must share one dtype of float16, bfloat16, float32")
    if (
        allowed.dtype != torch.bool
        or allowed.shape[:2] != (batch, q_len)
        or allowed.shape[2] > latent.shape[1]
    ):
        raise ValueError(
            f"allowed must be bool [B={batch}, q={q_len}, L <= {latent.shape[1]}]; got {tuple(allowed.shape)} "
            f"{allowed.dtype}"
        )
    if (
        indices.dim() != 3
        or indices.shape[:2] != (batch, q_len)
        or indices.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(
            f"indices must be int [B={batch}, q={q_len}, k]; got {tuple(indices.shape)} {indices.dtype}"
        )
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return _sparse_mla_op(q_lat, q_rot, latent, rot, indices, allowed, float(scaling), schedule)
