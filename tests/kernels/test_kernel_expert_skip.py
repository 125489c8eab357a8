"""expert_skip kernel (Triton interpreter on CPU, compiled on a GPU) against its reference (order_by_weight +
skip_counts), hand-made cases, and bad input."""

from __future__ import annotations

import pytest
import torch

from hf_sparse_verify.kernels._triton import triton_runs_on
from hf_sparse_verify.kernels.expert_skip import expert_skip, expert_skip_naive
from hf_sparse_verify.step.slots import MoESkip

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not triton_runs_on(DEVICE), reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1"
)


def _skip(rule: str, k: int, max_skip: int, seed: int) -> MoESkip:
    g = torch.Generator().manual_seed(seed)
    if rule == "budget":
        values = torch.tensor(0.3 + 0.6 * torch.rand(1, generator=g).item())
    else:
        values = torch.sort(torch.rand(k - 1, generator=g) * 0.6).values  # beta_1 <= beta_2 <= ...
    return MoESkip(rule, max_skip, values.to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rule", ["budget", "threshold"])
@pytest.mark.parametrize("tokens, k, max_skip", [(1, 8, 4), (5, 2, 1), (33, 8, 7), (7, 6, 3), (4, 8, 20)])
def test_matches_reference(dtype, rule, tokens, k, max_skip):
    g = torch.Generator().manual_seed(tokens * 31 + k)
    weights = torch.softmax(torch.randn(tokens, k, generator=g) * 2, dim=-1).to(DEVICE, dtype)
    index = torch.stack([torch.randperm(64, generator=g)[:k] for _ in range(tokens)]).to(DEVICE)
    skip = _skip(rule, k, max_skip, tokens + k)
    out = expert_skip(index, weights, skip)
    ref = expert_skip_naive(index, weights, skip)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert out[2].dtype == torch.int32 and torch.equal(out[2], ref[2])


def test_ties_keep_their_order_and_hand_cases():
    index = torch.tensor([[5, 6, 7, 8]], device=DEVICE)
    weights = torch.tensor([[0.25, 0.25, 0.4, 0.1]], device=DEVICE)
    ids, w, n = expert_skip(index, weights, MoESkip("budget", 3, torch.tensor(0.6, device=DEVICE)))
    assert ids.tolist() == [[7, 5, 6, 8]] and torch.equal(w, weights[:, [2, 0, 1, 3]])
    assert n.tolist() == [2]  # 0.4 < 0.6 <= 0.65
    # threshold: the lowest (0.1) is under beta_1 = 0.15, the two lowest (0.35) not under beta_2 = 0.3, the three
    # lowest (0.6) not under beta_3 = 0.5: one skipped; with beta_3 = 0.9 the largest passing count is 3
    _, _, n = expert_skip(
        index, weights, MoESkip("threshold", 3, torch.tensor([0.15, 0.3, 0.5], device=DEVICE))
    )
    assert n.tolist() == [3]
    _, _, n = expert_skip(
        index, weights, MoESkip("threshold", 3, torch.tensor([0.15, 0.3, 0.9], device=DEVICE))
    )
    assert n.tolist() == [1]
    _, _, n = expert_skip(
        index, weights, MoESkip("threshold", 0, torch.tensor([0.15, 0.3, 0.9], device=DEVICE))
    )
    assert n.tolist() == [4]


def test_bad_input():
    index, weights = torch.zeros(2, 4, dtype=torch.long), torch.rand(2, 4)
    with pytest.raises(ValueError, match="one shape"):
        expert_skip(index, weights[:, :3], MoESkip("budget", 1, torch.tensor(0.5)))
    with pytest.raises(ValueError, match="unknown MoESkip rule"):
        expert_skip(index, weights, MoESkip("median", 1, torch.tensor(0.5)))
    with pytest.raises(ValueError, match="at least 2 values"):
        expert_skip(index, weights, MoESkip("threshold", 2, torch.tensor([0.1])))


def test_bench_entry_runs():
    from hf_sparse_verify.kernels.registry import load_all

    cases = list(load_all()["expert_skip"](DEVICE, torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "torch"}
    for a, b in zip(cases[::2], cases[1::2]):
        for x, y in zip(a.run(), b.run()):
            assert torch.equal(x, y)
