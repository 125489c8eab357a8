"""``hsv::qkv_proj`` and ``hsv::rope_qk``: validation, registration with ``torch.library``, Triton where it runs,
the reference elsewhere (CPU without ``TRITON_INTERPRET=1``, float64)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._triton import triton_runs_on
from ..cache_write.naive import cache_write_naive
from .naive import qkv_proj_naive, rope_qk_naive

#: the projection kernel reads each weight once for up to this many token rows (decode and verify steps); callers
#: use ``F.linear`` above it
MAX_ROWS = 16
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _use_triton(x: torch.Tensor) -> bool:
    return triton_runs_on(x.device) and x.dtype != torch.float64


@torch.library.custom_op("hsv::qkv_proj", mutates_args=())
def _qkv_proj_op(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_q: torch.Tensor | None,
    b_k: torch.Tensor | None,
    b_v: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if _use_triton(x):
        from .kernel import qkv_proj_launch

        return qkv_proj_launch(x, w_q, w_k, w_v, b_q, b_k, b_v)
    q, k, v = qkv_proj_naive(x, w_q, w_k, w_v, b_q, b_k, b_v)
    return q.contiguous(), k.contiguous(), v.contiguous()


@_qkv_proj_op.register_fake
def _(x, w_q, w_k, w_v, b_q, b_k, b_v):
    rows = x.shape[0]
    return (
        x.new_empty((rows, w_q.shape[0])),
        x.new_empty((rows, w_k.shape[0])),
        x.new_empty((rows, w_v.shape[0])),
    )


@torch.library.custom_op("hsv::row_linear", mutates_args=())
def _row_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if _use_triton(x):
        from .kernel import row_linear_launch

        return row_linear_launch(x, weight, bias)
    return F.linear(x, weight, bias).contiguous()


@_row_linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("hsv::rope_qk", mutates_args=())
def _rope_qk_op(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    if _use_triton(q):
        from .kernel import rope_qk_launch

        return rope_qk_launch(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps)
    out_q, out_k = rope_qk_naive(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps)
    return out_q.contiguous(), out_k.contiguous()


@_rope_qk_op.register_fake
def _(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps):
    rows = q.shape[0]
    return q.new_empty((rows, q.shape[1] // head_dim, head_dim)), q.new_empty(
        (rows, k.shape[1] // head_dim, head_dim)
    )


@torch.library.custom_op("hsv::rope_qk_cache", mutates_args=("key_cache", "value_cache"))
def _rope_qk_cache_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    if _use_triton(q):
        from .kernel import rope_qk_cache_launch

        return rope_qk_cache_launch(
            q, k, v, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, key_cache, value_cache, slots
        )
    out_q, out_k = rope_qk_naive(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps)
    batch, q_len = slots.shape
    new_k = out_k.view(batch, q_len, -1, head_dim).transpose(1, 2)
    new_v = v.view(batch, q_len, -1, head_dim).transpose(1, 2)
    cache_write_naive(key_cache, value_cache, new_k, new_v, slots)
    return out_q.contiguous()


@_rope_qk_cache_op.register_fake
def _(q, k, v, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps, key_cache, value_cache, slots):
    return q.new_empty((q.shape[0], q.shape[1] // head_dim, head_dim))


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _same_device_and_dtype(what: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{what}: all tensors must be on one device; got {sorted(map(str, devices))}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOAT_DTYPES:
        raise ValueError(f"{what}: all tensors must share one float dtype; got {sorted(map(str, dtypes))}")


def qkv_proj(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_q: torch.Tensor | None = None,
    b_k: torch.Tensor | None = None,
    b_v: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The query, key and value projections of ``x`` in one launch (``F.linear`` of each, float32 accumulation,
    outputs in ``x.dtype``), reading each weight once for up to `MAX_ROWS` rows.

    Args:
        x: ``[T, H]`` with ``T <= MAX_ROWS``.
        w_q: ``[N_q, H]``; ``w_k``, ``w_v``: ``[N_kv, H]`` (``nn.Linear`` weights, ``x.dtype``). ``N_q`` and ``N_kv``
            must be multiples of 16.
        b_q, b_k, b_v: biases ``[N_*]``, all three or none.

    Returns:
        ``[T, N_q]``, ``[T, N_kv]``, ``[T, N_kv]``, contiguous.

    Example:
        >>> x, wq, wk, wv = torch.randn(2, 32), torch.randn(64, 32), torch.randn(32, 32), torch.randn(32, 32)
        >>> q, k, v = qkv_proj(x, wq, wk, wv)
        >>> torch.allclose(q, x @ wq.T, atol=1e-5), tuple(v.shape)
        (True, (2, 32))
    """
    if x.dim() != 2 or any(w.dim() != 2 for w in (w_q, w_k, w_v)):
        raise ValueError(
            f"qkv_proj needs x [T, H] and weights [N, H]; got {tuple(x.shape)}, {tuple(w_q.shape)}, "
            f"{tuple(w_k.shape)}, {tuple(w_v.shape)}"
        )
    rows, hidden = x.shape
    if rows > MAX_ROWS:
        raise ValueError(
            f"qkv_proj reads each weight once for at most {MAX_ROWS} rows; got {rows}: use F.linear"
        )
    if any(w.shape[1] != hidden for w in (w_q, w_k, w_v)) or w_k.shape != w_v.shape:
        raise ValueError(
            f"qkv_proj: weights must be [N_q, {hidden}], [N_kv, {hidden}], [N_kv, {hidden}]; got "
            f"{tuple(w_q.shape)}, {tuple(w_k.shape)}, {tuple(w_v.shape)}"
        )
    if w_q.shape[0] % 16 or w_k.shape[0] % 16:
        raise ValueError(
            f"qkv_proj needs projection widths that are multiples of 16; got {w_q.shape[0]} and {w_k.shape[0]}"
        )
    biases = (b_q, b_k, b_v)
    if any(b is None for b in biases) and any(b is not None for b in biases):
        raise ValueError("qkv_proj takes biases for all three projections or none")
    if b_q is not None and (
        b_q.shape != (w_q.shape[0],) or b_k.shape != (w_k.shape[0],) or b_v.shape != (w_v.shape[0],)
    ):
        raise ValueError("qkv_proj: each bias must be [N] of its weight")
    _same_device_and_dtype("qkv_proj", x, w_q, w_k, w_v, *(b for b in biases if b is not None))
    x, w_q, w_k, w_v = (_unit_last(t) for t in (x, w_q, w_k, w_v))
    if b_q is not None:
        b_q, b_k, b_v = (b.contiguous() for b in biases)
    return torch.ops.hsv.qkv_proj(x, w_q, w_k, w_v, b_q, b_k, b_v)


def row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for the few rows of decode and verify steps in one launch that reads the weight
    once (cuBLAS runs the attention output projection of one row as split-K plus a reduction kernel, neither of
    which can overlap its neighbours through programmatic dependent launch).

    Args:
        x: ``[T, K]`` with ``T <= MAX_ROWS``.
        weight: ``[N, K]`` (``N`` a multiple of 16), ``x.dtype``; bias: ``[N]`` or None.

    Returns:
        ``[T, N]`` in ``x.dtype``, contiguous (float32 accumulation, as ``F.linear``; not its summation order).

    Example:
        >>> x, w = torch.randn(2, 32), torch.randn(48, 32)
        >>> torch.allclose(row_linear(x, w), x @ w.T, atol=1e-5)
        True
    """
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"row_linear needs x [T, K] and weight [N, K]; got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if x.shape[0] > MAX_ROWS:
        raise ValueError(
            f"row_linear reads the weight once for at most {MAX_ROWS} rows; got {x.shape[0]}: use F.linear"
        )
    if weight.shape[0] % 16:
        raise ValueError(f"row_linear needs an output width that is a multiple of 16; got {weight.shape[0]}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"row_linear: bias must be [{weight.shape[0]}]; got {tuple(bias.shape)}")
    _same_device_and_dtype("row_linear", x, weight, *((bias,) if bias is not None else ()))
    return torch.ops.hsv.row_linear(
        _unit_last(x), _unit_last(weight), bias.contiguous() if bias is not None else None
    )


def _check_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight) -> None:
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_qk needs an even head_dim; got {head_dim}")
    if (
        q.dim() != 2
        or k.dim() != 2
        or q.shape[1] % head_dim
        or k.shape[1] % head_dim
        or k.shape[0] != q.shape[0]
    ):
        raise ValueError(
            f"rope_qk needs q [T, H_q * {head_dim}] and k [T, H_kv * {head_dim}]; got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    if cos.shape != (q.shape[0], head_dim) or sin.shape != cos.shape:
        raise ValueError(
            f"rope_qk needs cos and sin [T, D] = [{q.shape[0]}, {head_dim}]; got {tuple(cos.shape)} and "
            f"{tuple(sin.shape)} (partial rotary embeddings are not handled)"
        )
    norms = tuple(w for w in (q_norm_weight, k_norm_weight) if w is not None)
    if any(w.shape != (head_dim,) for w in norms):
        raise ValueError(f"rope_qk: norm weights must be [{head_dim}]; got {[tuple(w.shape) for w in norms]}")
    _same_device_and_dtype("rope_qk", q, k, cos, sin, *norms)


def rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optional per-head RMSNorm (Qwen3's ``q_norm`` / ``k_norm``) and the rotary embedding of queries and keys in
    one launch, with transformers' arithmetic and roundings (`rope_qk_naive`).

    Args:
        q: ``[T, H_q * D]``; k: ``[T, H_kv * D]`` (projection outputs, one row per token).
        cos, sin: ``[T, D]`` (the model's ``position_embeddings``, one row per token), ``q.dtype``.
        head_dim: ``D`` (even).
        q_norm_weight, k_norm_weight: ``[D]`` RMSNorm weights in ``q.dtype``, or None for no norm.
        eps: the norms' variance epsilon.

    Returns:
        rotated queries ``[T, H_q, D]`` and keys ``[T, H_kv, D]``, contiguous, in ``q.dtype``.

    Example:
        >>> q, k, cos, sin = torch.randn(3, 16), torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)
        >>> rq, rk = rope_qk(q, k, cos, sin, 8)
        >>> tuple(rq.shape), tuple(rk.shape)
        ((3, 2, 8), (3, 1, 8))
    """
    _check_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight)
    q, k, cos, sin = (_unit_last(t) for t in (q, k, cos, sin))
    norms_c = [w.contiguous() if w is not None else None for w in (q_norm_weight, k_norm_weight)]
    return torch.ops.hsv.rope_qk(q, k, cos, sin, int(head_dim), norms_c[0], norms_c[1], float(eps))


def rope_qk_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    q_norm_weight: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    eps: float,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """`rope_qk` that writes the step's keys (normed, rotated) and values ``v`` straight into a KV cache, in the same
    launch: ``key_cache[b, h, slots[b, i]]`` gets the key of row ``b * (T / B) + i``, head ``h`` (values likewise),
    which is what `rope_qk` followed by `hf_sparse_verify.kernels.cache_write.cache_write` computes, one launch
    fewer. Returns the rotated queries ``[T, H_q, D]``.

    Args:
        q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight, eps: as `rope_qk`.
        v: ``[T, H_kv * D]``, ``q.dtype``.
        key_cache, value_cache: ``[B, H_kv, C, D]`` of one shape, strides and dtype (``q.dtype``), unit last stride.
        slots: ``[B, T / B]`` integer slots, each below ``C``.

    Example:
        >>> q, k, v = torch.randn(2, 16), torch.randn(2, 8), torch.randn(2, 8)
        >>> cos, sin = torch.randn(2, 8), torch.randn(2, 8)
        >>> kc, vc = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8)
        >>> rq = rope_qk_cache(q, k, v, cos, sin, 8, None, None, 1e-6, kc, vc, torch.tensor([[1, 3]]))
        >>> torch.equal(vc[0, 0, 3], v[1]), torch.equal(kc[0, 0, 1], rope_qk(q, k, cos, sin, 8)[1][0, 0])
        (True, True)
    """
    batch = slots.shape[0] if slots.dim() == 2 else 0
    if slots.dim() != 2 or batch == 0 or q.shape[0] != batch * slots.shape[1] or slots.is_floating_point():
        raise ValueError(
            f"rope_qk_cache needs integer slots [B, T / B] for the {q.shape[0]} rows of q; got "
            f"{tuple(slots.shape)} {slots.dtype}"
        )
    if v.shape != k.shape or v.dtype != k.dtype:
        raise ValueError(f"rope_qk_cache needs v shaped like k {tuple(k.shape)}; got {tuple(v.shape)}")
    heads_kv = k.shape[1] // head_dim if head_dim > 0 else 0
    if (
        key_cache.dim() != 4
        or key_cache.shape[0] != batch
        or key_cache.shape[1] != heads_kv
        or key_cache.shape[3] != head_dim
        or value_cache.shape != key_cache.shape
        or value_cache.stride() != key_cache.stride()
        or key_cache.stride(-1) != 1
        or {key_cache.dtype, value_cache.dtype} != {q.dtype}
    ):
        raise ValueError(
            f"rope_qk_cache needs key and value caches [B, H_kv, C, D] = [{batch}, {heads_kv}, C, {head_dim}] of "
            f"one layout and q's dtype {q.dtype}; got {tuple(key_cache.shape)} {key_cache.dtype} and "
            f"{tuple(value_cache.shape)} {value_cache.dtype}"
        )
    _check_rope(q, k, cos, sin, head_dim, q_norm_weight, k_norm_weight)
    return torch.ops.hsv.rope_qk_cache(
        _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(cos), _unit_last(sin), int(head_dim),
        q_norm_weight.contiguous() if q_norm_weight is not None else None,
        k_norm_weight.contiguous() if k_norm_weight is not None else None,
        float(eps), key_cache, value_cache, slots,
    )  # fmt: skip
