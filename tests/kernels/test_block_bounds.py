"""Quest's block bounds (hf_sparse_verify.kernels.block_summary.bounds): build and score against loops over the
definition, the score bounding every key's q . k from above, the in-place update through a simulated decode with
rollbacks against a rebuild, and the setting's error."""

from __future__ import annotations

import doctest

import pytest
import torch

import hf_sparse_verify.kernels.block_summary.bounds as bounds_module
from hf_sparse_verify.kernels.block_summary.bounds import (
    build_block_bounds,
    score_block_bounds,
    update_block_bounds,
)
from hf_sparse_verify.sparse import SparseAttention


def _keys(batch=3, heads=2, capacity=45, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, capacity, heads, dim, generator=gen).transpose(1, 2)  # a non-contiguous view


def _loop_bounds(keys, pad, length, bs):
    batch, heads, capacity, dim = keys.shape
    n = -(-capacity // bs)
    out = torch.zeros(2, batch, heads, n, dim)
    for b in range(batch):
        for j in range(n):
            lo, hi = max(j * bs, int(pad[b])), min((j + 1) * bs, int(length[b]), capacity)
            if hi > lo:
                out[0, b, :, j] = keys[b, :, lo:hi].amin(1)
                out[1, b, :, j] = keys[b, :, lo:hi].amax(1)
    return out


def test_build_matches_the_definition():
    keys = _keys()
    pad, length = torch.tensor([0, 5, 17]), torch.tensor([45, 30, 18])
    torch.testing.assert_close(build_block_bounds(keys, pad, length, 8), _loop_bounds(keys, pad, length, 8))


def test_score_bounds_every_key_and_matches_the_definition():
    keys = _keys(batch=2, heads=2, capacity=40)
    pad, length, bs = torch.tensor([0, 9]), torch.tensor([40, 33]), 8
    query = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(1))  # 4 query heads over 2 KV heads
    bounds = build_block_bounds(keys, pad, length, bs)
    scores = score_block_bounds(query, bounds, pad, length, bs, scale=0.5)
    for b in range(2):
        for g in range(2):
            for j in range(5):
                lo, hi = max(j * bs, int(pad[b])), min((j + 1) * bs, int(length[b]))
                if hi <= lo:
                    assert scores[b, g, j] == float("-inf")
                    continue
                block = keys[b, g, lo:hi]  # [S, D]
                heads = query[b, 2 * g : 2 * g + 2]  # [2, D]
                expected = torch.maximum(heads * block.amin(0), heads * block.amax(0)).sum() * 0.5
                torch.testing.assert_close(scores[b, g, j], expected)
                # an upper bound: each head's bound is >= its best key in the block
                best = (heads @ block.T).amax(1).sum() * 0.5
                assert scores[b, g, j] >= best - 1e-5
    rows = score_block_bounds(torch.stack([query, -query]), bounds, pad, length, bs, scale=0.5)
    torch.testing.assert_close(rows[0], scores)


def test_update_follows_a_decode_with_rollbacks():
    """Steps of 3 new keys with rollbacks (start moves back 2, rejected drafts' keys stay in the cache): after each
    update the bounds of every block up to the row's end equal a rebuild from the valid keys."""
    batch, heads, capacity, dim, bs = 2, 2, 64, 4, 8
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(batch, heads, capacity, dim, generator=gen)
    pad, start = torch.tensor([0, 6]), torch.tensor([20, 20])
    bounds = build_block_bounds(keys, pad, start, bs)
    for step in range(8):
        for b in range(batch):
            keys[b, :, int(start[b]) : int(start[b]) + 3] = torch.randn(heads, 3, dim, generator=gen)
        update_block_bounds(keys, bounds, pad, start, 3, bs)
        end = start + 3
        fresh = _loop_bounds(keys, pad, end, bs)
        for b in range(batch):
            whole = int(end[b]) // bs + 1  # blocks up to the one holding the row's last key
            torch.testing.assert_close(bounds[:, b, :, :whole], fresh[:, b, :, :whole])
        start = end - (2 if step % 3 == 1 else 0)  # a rollback every third step


def test_docstrings_and_setting_error():
    assert doctest.testmod(bounds_module).failed == 0
    with pytest.raises(ValueError, match="block score"):
        SparseAttention(score="max")
