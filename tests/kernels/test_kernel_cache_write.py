"""Cache-write kernel vs the two scatters it replaces."""

from __future__ import annotations

import pytest
import torch

from hf_sparse_verify.kernels.cache_write import cache_write, cache_write_naive


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_len, dim", [(1, 16), (5, 24), (3, 64)])
def test_matches_scatter(dtype, q_len, dim):
    g = torch.Generator().manual_seed(q_len * dim)
    kc = torch.randn(3, 2, 40, dim, generator=g).to(dtype)
    vc = torch.randn(3, 2, 40, dim, generator=g).to(dtype)
    # strided, as transformers passes them; float32 into float16 tests the conversion (Triton's CPU interpreter
    # truncates float32 -> bfloat16 where torch rounds, so bfloat16 keys arrive as bfloat16, as in a bf16 model)
    source = torch.float32 if dtype == torch.float16 else dtype
    key = torch.randn(3, q_len, 2, dim, generator=g).transpose(1, 2).to(source)
    value = torch.randn(3, q_len, 2, dim, generator=g).transpose(1, 2).to(source)
    slots = torch.tensor([7, 20, 33])[:, None] + torch.arange(q_len)  # ragged rows
    expected_k, expected_v = kc.clone(), vc.clone()
    cache_write_naive(expected_k, expected_v, key, value, slots)
    cache_write(kc, vc, key, value, slots)
    assert torch.equal(kc, expected_k) and torch.equal(vc, expected_v)


def test_bad_input():
    kc = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="slots must be"):
        cache_write(kc, kc.clone(), torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="do not match the cache"):
        cache_write(kc, kc.clone(), torch.ones(1, 3, 1, 4), torch.ones(1, 3, 1, 4), torch.tensor([[1]]))
