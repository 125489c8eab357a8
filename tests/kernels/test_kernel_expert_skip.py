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
    with pytest.raises(ValueError, match="unknown skip rule"):
        expert_skip(index, weights, MoESkip("median", 1, torch.tensor(0.5)))
    with pytest.raises(ValueError, match="at least 2 values"):
        expert_skip(index, weights, MoESkip("threshold", 2, torch.tensor([0.1])))


def test_bench_entry_runs():
    from hf_sparse_verify.kernels.bench_registry import load_all

    cases = list(load_all()["expert_skip"](DEVICE, torch.float32, True))
    assert {c.variant for c in cases} == {"triton", "torch"}
    for a, b in zip(cases[::2], cases[1::2]):
        for x, y in zip(a.run(), b.run()):
            assert torch.equal(x, y)


def _routing(tokens: int, k: int, experts: int, seed: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    weights = torch.softmax(torch.randn(tokens, k, generator=g) * 2, dim=-1).to(DEVICE, dtype)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).to(DEVICE)
    return index, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens, group, k, experts, max_skip, row_experts",
    [
        (8, 8, 8, 128, 7, 8),
        (14, 7, 4, 16, 3, 4),
        (16, 16, 8, 32, 6, 10),
        (3, 1, 8, 64, 7, 2),
        (6, 2, 2, 4, 1, 1),
    ],
)
def test_row_union_matches_reference(dtype, tokens, group, k, experts, max_skip, row_experts):
    # few experts (4-16) make rows share experts, so the summed weights and the set really decide
    index, weights = _routing(tokens, k, experts, tokens * 7 + k, dtype)
    skip = MoESkip("row_union", max_skip, torch.tensor(float(row_experts), device=DEVICE))
    out = expert_skip(index, weights, skip, group)
    ref = expert_skip_naive(index, weights, skip, group)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert out[2].dtype == torch.int32 and torch.equal(out[2], ref[2])


def test_row_union_reference_beyond_the_kernel_rows():
    # 40 tokens x 8 = 320 pairs per row: over MAX_ROW_PAIRS, so the op runs the reference; same answer as calling it
    index, weights = _routing(40, 8, 64, 5)
    skip = MoESkip("row_union", 7, torch.tensor(12.0, device=DEVICE))
    out, ref = expert_skip(index, weights, skip, 40), expert_skip_naive(index, weights, skip, 40)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))


def test_row_union_bad_group():
    index, weights = torch.zeros(6, 4, dtype=torch.long), torch.rand(6, 4)
    with pytest.raises(ValueError, match="rows of group=4"):
        expert_skip(index, weights, MoESkip("row_union", 3, torch.tensor(2.0)), 4)
