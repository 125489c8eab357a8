"""Triton MoE routing in one launch: router logits, float32 softmax, top-k (``k`` rounds of max / lowest-index
argmax / mask) and renormalization. Grid from shapes only; no host sync.

Two paths (`launch`'s ``logits_in_kernel``, default `LOGITS_IN_KERNEL`, for at most `FUSED_MAX_ROWS` token rows):

- ``_router_fused_kernel`` (logits in the kernel): a grid of ``cdiv(E, E_TILE) x splits`` programs (~64 at the
  Qwen3-30B-A3B size), each reading one ``[E_TILE, H / splits]`` slice of the weight once and multiplying it by
  all ``T`` rows in float32 (``tl.dot`` for T > 1, a multiply-reduce for T = 1). Partial sums go to a float32
  workspace ``[splits, T_BLOCK, E_BLOCK]``; each program then bumps a per-device counter (acq_rel atomic), and the
  program that sees ``n_programs - 1`` sums the partials in split order (deterministic), stores the logits in
  ``hidden.dtype``, routes every row from those rounded logits and resets the counter to 0 (CUDA-graph replays
  start from 0 again). A first version read the whole ``[E, H]`` weight in one program per row: 52 us per layer.
  H200, Qwen3-30B-A3B router (bf16), graphs of 48 calls: 4.99 / 6.08 / 6.55 us per call at T = 1 / 8 / 16 against
  7.11 / 7.36 / 7.62 us for the path below; decode step 3.71 vs 3.82 ms (benchmarks/results/moe_router_fused.json).
- ``_moe_router_kernel`` (logits from ``F.linear``, i.e. cuBLAS): one routing program per row after the GEMM.

Counter assumption: one int32 counter per device (`_counter`), so two launches of the fused path must never run
concurrently on one device (different streams without ordering between them). Our engine runs every step on one
stream per device, and CUDA graphs replay in stream order, so this holds; the first call on a device must happen
outside graph capture (capture code warms up first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._triton import dot_in_float32, next_power_of_2, on_input_device, pdl_launch, pdl_wait

#: default of `launch`'s ``logits_in_kernel`` (benchmarks flip it to time both paths side by side)
LOGITS_IN_KERNEL = True
#: the fused path takes at most this many token rows (its ``tl.dot`` pads T to 16); more rows use F.linear
FUSED_MAX_ROWS = 16
#: experts per program of the fused path (``tl.dot`` needs N >= 16)
E_TILE = 16
#: the fused path aims at about this many programs (experts tiles x hidden splits)
TARGET_PROGRAMS = 64
#: smallest hidden slice per program
MIN_SLICE = 64
FUSED_NUM_WARPS = 4


@triton.jit
def _route_rows(
    b_logit, offs_t, t_ok, SCORES, INDICES,
    n_experts, top_k, s_st, s_it,
    NORMALIZE: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr,
):  # fmt: skip
    """Softmax, top-k and renormalization of the logits ``b_logit [T_BLOCK, E_BLOCK]`` (float32 values of the
    logits' dtype); rows past ``t_ok`` are computed and not stored."""
    offs_e = tl.arange(0, E_BLOCK)
    e_ok = offs_e < n_experts
    b_l = tl.where(e_ok[None, :], b_logit, float("-inf"))
    b_p = tl.exp(b_l - tl.max(b_l, axis=1)[:, None])
    b_p = b_p / tl.sum(b_p, axis=1)[:, None]

    # one max per round: the key holds the probability's bits (ordered as integers for p >= 0) above the
    # complemented expert id, so the largest key is the largest probability and, among equal ones, the lowest id
    b_key = (b_p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (E_BLOCK - 1 - offs_e)[None, :].to(tl.int64)
    b_key = tl.where(e_ok[None, :], b_key, -2)  # padding: below every probability, never picked (k <= E)
    offs_k = tl.arange(0, K_BLOCK)
    b_val = tl.zeros([b_p.shape[0], K_BLOCK], dtype=tl.float32)
    b_idx = tl.zeros([b_p.shape[0], K_BLOCK], dtype=tl.int32)
    for j in range(top_k):
        b_best = tl.max(b_key, axis=1)  # [T_BLOCK]
        b_arg = E_BLOCK - 1 - b_best.to(tl.int32)  # low 32 bits
        b_max = (b_best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        b_val = tl.where(offs_k[None, :] == j, b_max[:, None], b_val)
        b_idx = tl.where(offs_k[None, :] == j, b_arg[:, None], b_idx)
        b_key = tl.where(b_key == b_best[:, None], -1, b_key)
    if NORMALIZE:
        b_val = b_val / tl.sum(b_val, axis=1)[:, None]  # lanes past k hold 0
    k_ok = t_ok[:, None] & (offs_k[None, :] < top_k)
    p_s = SCORES + offs_t[:, None] * s_st + offs_k[None, :]
    p_i = INDICES + offs_t[:, None] * s_it + offs_k[None, :]
    tl.store(p_s, b_val.to(SCORES.dtype.element_ty), mask=k_ok)
    tl.store(p_i, b_idx.to(tl.int64), mask=k_ok)


@triton.jit
def _moe_router_kernel(
    LOGITS, SCORES, INDICES,
    n_experts, top_k, s_lt, s_st, s_it,
    NORMALIZE: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs_t = row + tl.arange(0, 1)
    offs_e = tl.arange(0, E_BLOCK)
    p_l = LOGITS + offs_t[:, None] * s_lt + offs_e[None, :]
    b_l = tl.load(p_l, mask=offs_e[None, :] < n_experts, other=0.0).to(tl.float32)  # [1, E_BLOCK]
    _route_rows(
        b_l, offs_t, offs_t >= 0, SCORES, INDICES, n_experts, top_k, s_st, s_it,
        NORMALIZE, E_BLOCK, K_BLOCK,
    )  # fmt: skip


@triton.jit
def _router_fused_kernel(
    HIDDEN, WEIGHT, PARTIAL, COUNTER, LOGITS, SCORES, INDICES,
    tokens, n_experts, hidden_dim, top_k, s_ht, s_we, s_lt, s_st, s_it,
    NORMALIZE: tl.constexpr, T_BLOCK: tl.constexpr, E_TILE: tl.constexpr, H_SLICE: tl.constexpr,
    H_CHUNK: tl.constexpr, SPLITS: tl.constexpr, E_BLOCK: tl.constexpr, K_BLOCK: tl.constexpr,
    DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_wait(PDL)
    pid_e, pid_h = tl.program_id(0), tl.program_id(1)
    n_programs = tl.num_programs(0) * tl.num_programs(1)
    offs_t = tl.arange(0, T_BLOCK)
    offs_e = pid_e * E_TILE + tl.arange(0, E_TILE)
    offs_c = tl.arange(0, H_CHUNK)
    t_ok = offs_t < tokens
    e_ok = offs_e < n_experts
    h_first = pid_h * H_SLICE

    # this program's partial logits: rows [T_BLOCK] x its experts [E_TILE] over its hidden slice
    if T_BLOCK == 1:
        b_acc = tl.zeros([E_TILE, H_CHUNK], dtype=tl.float32)
        for h0 in tl.static_range(0, H_SLICE, H_CHUNK):
            offs_h = h_first + h0 + offs_c
            h_ok = offs_h < hidden_dim
            b_x = tl.load(HIDDEN + offs_h, mask=h_ok, other=0.0).to(tl.float32)  # [H_CHUNK]
            p_w = WEIGHT + offs_e[:, None].to(tl.int64) * s_we + offs_h[None, :]
            b_w = tl.load(p_w, mask=e_ok[:, None] & h_ok[None, :], other=0.0).to(
                tl.float32
            )  # [E_TILE, H_CHUNK]
            b_acc += b_w * b_x[None, :]
        b_part = tl.sum(b_acc, axis=1)[None, :]  # [1, E_TILE]
    else:
        b_part = tl.zeros([T_BLOCK, E_TILE], dtype=tl.float32)
        for h0 in tl.static_range(0, H_SLICE, H_CHUNK):
            offs_h = h_first + h0 + offs_c
            h_ok = offs_h < hidden_dim
            p_x = HIDDEN + offs_t[:, None].to(tl.int64) * s_ht + offs_h[None, :]
            b_x = tl.load(p_x, mask=t_ok[:, None] & h_ok[None, :], other=0.0)  # [T_BLOCK, H_CHUNK]
            p_w = WEIGHT + offs_e[None, :].to(tl.int64) * s_we + offs_h[:, None]
            b_w = tl.load(p_w, mask=e_ok[None, :] & h_ok[:, None], other=0.0)  # [H_CHUNK, E_TILE]
            if DOT_F32:
                b_x, b_w = b_x.to(tl.float32), b_w.to(tl.float32)
            b_part = tl.dot(b_x, b_w, b_part, input_precision=DOT_PRECISION)
    p_part = PARTIAL + (pid_h * T_BLOCK + offs_t[:, None]) * E_BLOCK + offs_e[None, :]
    tl.store(p_part, b_part, mask=e_ok[None, :])

    # every thread's stores, then one release/acquire bump: the last program sees all partials
    tl.debug_barrier()
    done = tl.atomic_add(COUNTER, 1, sem="acq_rel", scope="gpu")
    if done == n_programs - 1:
        offs_r = tl.arange(0, E_BLOCK)
        mask = t_ok[:, None] & (offs_r[None, :] < n_experts)
        p_sum = PARTIAL + offs_t[:, None] * E_BLOCK + offs_r[None, :]
        b_sum = tl.zeros([T_BLOCK, E_BLOCK], dtype=tl.float32)
        for split in tl.static_range(SPLITS):  # unrolled: the loads go out together; fixed order: same sum
            b_sum += tl.load(p_sum + split * T_BLOCK * E_BLOCK, mask=mask, other=0.0, cache_modifier=".cg")
        b_logit = b_sum.to(LOGITS.dtype.element_ty)
        tl.store(LOGITS + offs_t[:, None] * s_lt + offs_r[None, :], b_logit, mask=mask)
        _route_rows(
            b_logit.to(tl.float32), offs_t, t_ok, SCORES, INDICES, n_experts, top_k, s_st, s_it,
            NORMALIZE, E_BLOCK, K_BLOCK,
        )  # fmt: skip
        tl.atomic_xchg(COUNTER, 0, sem="relaxed", scope="gpu")


def _empty(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Every output of the launch (tests poison them through this)."""
    return torch.empty(shape, device=device, dtype=dtype)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counter(device: torch.device) -> torch.Tensor:
    """The fused path's int32 arrival counter on ``device`` (0 between launches), created on first use."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    counter = _COUNTERS.get(device)
    if counter is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "moe_router's first call on a device must run outside CUDA-graph capture (it allocates the "
                "device's arrival counter); run one warm-up call before capturing"
            )
        counter = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def fused_split(n_experts: int, hidden_dim: int) -> tuple[int, int]:
    """``(hidden slice, splits)`` of the fused path: about `TARGET_PROGRAMS` programs over ``cdiv(E, E_TILE)``
    expert tiles, each slice a power of two of at least `MIN_SLICE` columns."""
    tiles = triton.cdiv(n_experts, E_TILE)
    wanted = max(1, TARGET_PROGRAMS // tiles)
    h_slice = max(MIN_SLICE, next_power_of_2(triton.cdiv(hidden_dim, wanted)))
    return h_slice, triton.cdiv(hidden_dim, h_slice)


def _launch_fused(hidden, weight, logits, scores, indices, top_k, normalize, h_slice=None):
    tokens, hidden_dim = hidden.shape
    n_experts = weight.shape[0]
    if h_slice is None:
        h_slice, splits = fused_split(n_experts, hidden_dim)
    else:
        splits = triton.cdiv(hidden_dim, h_slice)
    t_block = 1 if tokens == 1 else 16
    e_block = max(16, next_power_of_2(n_experts))
    h_chunk = min(h_slice, 256 if t_block > 1 else 512)
    upcast = dot_in_float32(hidden.dtype)
    float32_dot = upcast or hidden.dtype == torch.float32  # "ieee": no TF32 rounding of float32 operands
    partial = _empty((splits, t_block, e_block), hidden.device, torch.float32)  # written before read
    _router_fused_kernel[(triton.cdiv(n_experts, E_TILE), splits)](
        hidden, weight, partial, _counter(hidden.device), logits, scores, indices,
        tokens, n_experts, hidden_dim, top_k, hidden.stride(0), weight.stride(0), logits.stride(0),
        scores.stride(0), indices.stride(0),
        NORMALIZE=normalize, T_BLOCK=t_block, E_TILE=E_TILE, H_SLICE=h_slice, H_CHUNK=h_chunk, SPLITS=splits,
        E_BLOCK=e_block, K_BLOCK=max(2, next_power_of_2(top_k)), DOT_F32=upcast,
        DOT_PRECISION="ieee" if float32_dot else "tf32",
        num_warps=FUSED_NUM_WARPS,
        **pdl_launch(hidden.device),
    )  # fmt: skip


@on_input_device
def launch(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    normalize: bool,
    scores_float32: bool,
    logits_in_kernel: bool | None = None,
    h_slice: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the kernel (inputs as `moe_router` checks them, both with unit last stride). Returns ``(logits [T, E],
    scores [T, k], indices [T, k] int64)``.

    ``logits_in_kernel`` (default `LOGITS_IN_KERNEL`) picks the one-launch path for ``T <= FUSED_MAX_ROWS``;
    otherwise (or for more rows) the logits come from ``F.linear``. ``h_slice`` overrides `fused_split`'s hidden
    slice per program (benchmarks)."""
    tokens = hidden.shape[0]
    n_experts = weight.shape[0]
    device = hidden.device
    fused = LOGITS_IN_KERNEL if logits_in_kernel is None else logits_in_kernel
    fused = fused and 0 < tokens <= FUSED_MAX_ROWS
    logits = (
        _empty((tokens, n_experts), device, hidden.dtype) if fused else F.linear(hidden, weight)
    )  # [T, E]
    scores = _empty((tokens, top_k), device, torch.float32 if scores_float32 else hidden.dtype)
    indices = _empty((tokens, top_k), device, torch.int64)
    if tokens == 0:
        return logits, scores, indices
    if fused:
        _launch_fused(hidden, weight, logits, scores, indices, top_k, normalize, h_slice)
        return logits, scores, indices
    e_block = max(16, next_power_of_2(n_experts))
    _moe_router_kernel[(tokens,)](
        logits, scores, indices,
        n_experts, top_k, logits.stride(0), scores.stride(0), indices.stride(0),
        NORMALIZE=normalize, E_BLOCK=e_block, K_BLOCK=max(2, next_power_of_2(top_k)),
        num_warps=1 if e_block <= 256 else 4,
        **pdl_launch(logits.device),
    )  # fmt: skip
    return logits, scores, indices
