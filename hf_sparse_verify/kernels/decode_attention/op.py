"""``hsv::decode_attention``: the public op (validation, registration with ``torch.library``, dispatch to the
Triton kernel where Triton runs and to the reference elsewhere)."""

from __future__ import annotations

import torch

from .._triton import multiprocessors, triton_runs_on
from .naive import decode_attention_naive

COLLECT_MODES = {None: 0, "two_rows": 1, "all_rows": 2}
#: query rows one program holds: (query heads per KV head) x (new tokens per row)
MAX_ROWS = 128

#: programs to aim for per launch (about twice the H100/H200 SM count) and the fewest slots worth a split
TARGET_PROGRAMS = 264
MIN_SPLIT_SLOTS = 64
MAX_SPLITS = 64
#: streaming multiprocessors assumed when the device does not say (H100 / H200)
SM_COUNT = 132


def default_splits(batch: int, kv_heads: int, capacity: int, sm_count: int = SM_COUNT) -> int:
    """Splits per (row, KV head) from shapes only: enough programs to fill the GPU (`TARGET_PROGRAMS`), at least
    `MIN_SPLIT_SLOTS` cache slots each, and, from there up to twice as many, the count whose programs spread most
    evenly over the ``sm_count`` multiprocessors (the fewest on a tie).

    Every program of a launch reads the same number of slots, so the launch lasts as long as the busiest
    multiprocessor: 288 programs on 132 SMs put 3 on some and 2 on others (73% of the work an even spread gives).
    Measured on an H200 (`benchmarks/sweep_decode_attention.py`, 8B heads, bf16, us per layer): batch 4 x 64K, 9
    splits (288 programs) against 18 (576): 392 / 313 us for a 7-token verify, 482 / 400 with Vegas scores, 279 /
    257 for decode; 16 x 16K, 3 splits (384 programs) against 6 (768): 307 / 317 us, 250 / 250 us."""
    by_length = -(-capacity // MIN_SPLIT_SLOTS)
    by_occupancy = -(-TARGET_PROGRAMS // (batch * kv_heads))
    low = max(1, min(by_length, by_occupancy, MAX_SPLITS))
    high = max(low, min(by_length, 2 * by_occupancy, MAX_SPLITS))

    def balance(splits: int) -> float:
        programs = batch * kv_heads * splits
        return programs / (sm_count * -(-programs // sm_count))

    return max(range(low, high + 1), key=lambda splits: (round(balance(splits), 6), -splits))


@torch.library.custom_op("hsv::decode_attention", mutates_args=("carried_lse",))
def _decode_attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    scale: float,
    window: int,
    collect: int,
    num_splits: int,
    weights: bool,
    per_kv_head: bool,
    softcap: float,
    sinks: torch.Tensor | None,
    carried_lse: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = query.shape[0]
    if triton_runs_on(query.device) and query.dtype != torch.float64:
        from .kernel import launch

        out, per_head = launch(
            query, key, value, start, pad, scale, window, collect, num_splits, weights, softcap, sinks,
            mean_heads=not per_kv_head, carried_lse=carried_lse,
        )  # fmt: skip
        if per_head is None:
            return out, query.new_empty(batch, 0, dtype=torch.float32)
        return out, (per_head if per_kv_head or per_head.dim() == 2 else per_head.mean(dim=1))
    mode = {0: None, 1: "two_rows", 2: "all_rows"}[collect]
    out, scores = decode_attention_naive(
        query, key, value, start, pad, scale, window, mode, weights=weights, per_kv_head=per_kv_head,
        softcap=softcap, sinks=sinks, carried_lse=carried_lse,
    )  # fmt: skip
    if scores is None:
        scores = query.new_empty(batch, 0, dtype=torch.float32)
    return out.contiguous(), scores


@_decode_attention_op.register_fake
def _(
    query, key, value, start, pad, scale, window, collect, num_splits, weights, per_kv_head, softcap, sinks,
    carried_lse,
):  # fmt: skip
    batch, heads, q_len, dim = query.shape
    out = query.new_empty(batch, q_len, heads, dim)
    if not collect:
        return out, query.new_empty(batch, 0, dtype=torch.float32)
    shape = (batch, key.shape[1], key.shape[2]) if per_kv_head else (batch, key.shape[2])
    return out, query.new_empty(*shape, dtype=torch.float32)


def _validate(
    query, key, value, start, pad, window, collect, softcap=0.0, sinks=None, weights=False, carried_lse=None
) -> None:  # fmt: skip
    if carried_lse is not None:
        batch, heads = query.shape[:2]
        if not (collect and weights):
            raise ValueError(
                "carried_lse normalises collected softmax weights: pass collect=... and weights=True"
            )
        if (
            carried_lse.shape != (batch, heads)
            or carried_lse.dtype != torch.float32
            or carried_lse.device != query.device
            or not carried_lse.is_contiguous()
        ):
            raise ValueError(
                f"carried_lse must be a contiguous float32 [B, H] = [{batch}, {heads}] tensor on {query.device}; "
                f"got {carried_lse.dtype} {tuple(carried_lse.shape)} on {carried_lse.device}"
            )
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0 = no soft-capping), got {softcap}")
    if sinks is not None and (
        sinks.shape != (query.shape[1],) or sinks.device != query.device or sinks.stride() != (1,)
    ):
        raise ValueError(
            f"sinks must be one logit per query head, a contiguous [{query.shape[1]}] tensor on {query.device}; "
            f"got {tuple(sinks.shape)} (strides {sinks.stride()}) on {sinks.device}"
        )
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError(
            f"query must be [B, H, q, D] and key/value [B, H_kv, C, D]; got {tuple(query.shape)} and "
            f"{tuple(key.shape)}"
        )
    if key.shape != value.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have the same shape")
    batch, heads, q_len, dim = query.shape
    if key.shape[0] != batch or key.shape[3] != dim:
        raise ValueError(
            f"key {tuple(key.shape)} does not match query {tuple(query.shape)} in batch or head_dim"
        )
    if heads % key.shape[1]:
        raise ValueError(f"query heads ({heads}) must be a multiple of KV heads ({key.shape[1]})")
    if q_len < 1 or heads // key.shape[1] * q_len > MAX_ROWS:
        raise ValueError(
            f"decode attention holds (query heads per KV head) x (new tokens) <= {MAX_ROWS} rows per program; got "
            f"{heads // key.shape[1]} x {q_len}: use fewer new tokens per step (or the reference attention)"
        )
    if not (query.dtype == key.dtype == value.dtype):
        raise ValueError(f"query, key and value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value must be contiguous in the last dimension (head_dim)")
    for name, t in (("start", start), ("pad", pad)):
        if t.shape != (batch,) or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"{name} must be an int32/int64 tensor of shape [{batch}], got {t.dtype} {tuple(t.shape)}"
            )
    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = no sliding window), got {window}")
    if collect not in COLLECT_MODES:
        raise ValueError(
            f"collect must be one of {sorted(k for k in COLLECT_MODES if k)} or None, got {collect!r}"
        )


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    start: torch.Tensor,
    pad: torch.Tensor,
    scale: float,
    *,
    window: int = 0,
    collect: str | None = None,
    weights: bool = False,
    per_kv_head: bool = False,
    num_splits: int | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    carried_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of ``q`` new tokens per row (``q * H / H_kv <= 128``) over a preallocated KV cache.

    Query ``i`` of row ``b`` sits at slot ``start[b] + i`` and attends to slots ``pad[b] .. start[b] + i`` (within
    ``window`` on sliding layers). No host synchronisation: the op can be captured in a CUDA graph.

    Args:
        query: ``[B, H, q, D]`` (any strides).
        key, value: ``[B, H_kv, C, D]`` cache buffers.
        start, pad: ``[B]`` int32/int64 on the cache's device.
        scale: softmax scale.
        window: sliding window, 0 for none.
        collect: None, ``"two_rows"`` (first and last query row, Vegas' Collect-2-Query) or ``"all_rows"``: also
            return the raw logits ``q . k * scale`` averaged over every query head and those rows, ``[B, C]``
            float32 (0 outside the slots each row reads).
        weights: score by softmax weights ``exp(logit - lse)`` instead of raw logits (Vegas' released code).
        per_kv_head: scores ``[B, H_kv, C]``, averaged over each KV head's query heads only.
        num_splits: splits of the KV range per (row, KV head); default from shapes (`default_splits`).
        softcap: logit soft-capping ``softcap * tanh(logit / softcap)`` (Gemma 2, Cohere 2); 0 for none.
        sinks: ``[H]`` per-head sink logits in the softmax denominator (GPT-OSS); scores stay the softmax over
            the cached slots alone.
        carried_lse: ``[B, H]`` float32 (with ``weights``): normalise the weights of every scored row of head
            ``h`` by ``carried_lse[:, h]`` instead of the row's own log-sum-exp (one pass: the split kernel sums
            them); the op then overwrites it with the first query row's log-sum-exp (in place), the next step's
            normaliser.

    Returns:
        ``(out [B, q, H, D], scores [B, C] or None)``.

    Example:
        >>> q, k = torch.randn(1, 4, 2, 16), torch.randn(1, 2, 8, 16)
        >>> out, _ = decode_attention(q, k, k, torch.tensor([5]), torch.tensor([0]), 0.25)
        >>> tuple(out.shape)
        (1, 2, 4, 16)
    """
    _validate(query, key, value, start, pad, window, collect, softcap, sinks, weights, carried_lse)
    if num_splits is None:
        num_splits = default_splits(
            query.shape[0], key.shape[1], key.shape[2], multiprocessors(query.device) or SM_COUNT
        )
    out, scores = torch.ops.hsv.decode_attention(
        query,
        key,
        value,
        start,
        pad,
        float(scale),
        int(window),
        COLLECT_MODES[collect],
        int(num_splits),
        bool(weights),
        bool(per_kv_head),
        float(softcap),
        sinks,
        carried_lse,
    )
    return out, (scores if collect else None)
