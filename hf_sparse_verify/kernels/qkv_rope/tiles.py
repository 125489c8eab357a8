"""Tile settings of the ``qkv_rope`` kernels and the block widths they imply (plain Python: the modules that pick a
path read these without importing Triton)."""

from __future__ import annotations

#: tile settings (``proj_n`` also has to divide the projections' widths; see `proj_block_n`). From the H200 sweep
#: of 144 settings (`benchmarks/sweep_qkv_rope.py --wide`, `results/sweep_qkv_rope.json (record qkv)`, PDL on, us per
#: call): best sum over Qwen3-30B-A3B and Llama-3.1-8B at 1 and 16 rows, 42.75 against 50.75 for the earlier
#: 4 warps / 3 stages (one row: 6.50 against 7.48 and 14.08 against 17.70)
TILES = {
    "proj_n": 32,
    "proj_k": 128,
    "num_warps": 2,
    "num_stages": 4,
    # the single-weight `row_linear_launch` (attention output projection): best sum of the H200 sweep of 54
    # settings (`sweep_qkv_rope.py --kernel out`, `results/sweep_qkv_rope.json (record out)`), 30.49 us over both
    # shapes at 1 and 16 rows
    "out_n": 16,
    "out_k": 512,
    "out_warps": 2,
    "out_stages": 4,
}


def proj_block_n(n_q: int, n_kv: int) -> int | None:
    """Output columns per program: the largest power of two up to ``TILES["proj_n"]`` dividing both widths, or None
    when that is below 16 (``tl.dot``'s smallest tile; the caller then uses ``F.linear``)."""
    block = TILES["proj_n"]
    while block >= 16 and (n_q % block or n_kv % block):
        block //= 2
    return block if block >= 16 else None


def linear_block_n(n_out: int) -> int | None:
    """Output columns per program of `row_linear_launch` (as `proj_block_n`, for one width)."""
    block = TILES["out_n"]
    while block >= 16 and n_out % block:
        block //= 2
    return block if block >= 16 else None
