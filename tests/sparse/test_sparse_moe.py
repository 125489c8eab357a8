"""Expert skipping (the sparse-verification paper §3.5): hand-made `skip_counts` cases for both rules, the calibration statistics, the
``"hsv_fused"`` experts under a verify step's `MoESkip` against a plain reference, and the NLL damage check."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from conftest import VOCAB, decoding_experts, make_model
from moe_models import MOE_ARCHS, make_moe, needs_triton

from hf_sparse_verify._compat import experts_layers
from hf_sparse_verify.drivers.moe_damage import RouterStats, calibrate_moe, measure_damage
from hf_sparse_verify.integrations import fused_experts as fused
from hf_sparse_verify.integrations import fused_experts_forward
from hf_sparse_verify.integrations.fused_experts import record_layers
from hf_sparse_verify.kernels.expert_skip.naive import order_by_weight, row_union, skip_counts
from hf_sparse_verify.kernels.fused_experts import kernel as kernel_module
from hf_sparse_verify.sparse import LossySparseVerify, SparseMoE
from hf_sparse_verify.sparse.moe import ExpertSkips
from hf_sparse_verify.step.context import StepContext, step_scope
from hf_sparse_verify.step.slots import MoESkip

# dyadic shares (exact in float32): highest first 0.5, 0.25, 0.125, 0.125
DYADIC = [0.5, 0.25, 0.125, 0.125]


def threshold(m: int, betas) -> MoESkip:
    return MoESkip("threshold", m, torch.tensor(betas, dtype=torch.float32))


def budget(m: int, share: float) -> MoESkip:
    return MoESkip("budget", m, torch.tensor(share, dtype=torch.float32))


def counts(weights, skip: MoESkip) -> list[int]:
    n = skip_counts(torch.tensor(weights, dtype=torch.float32), skip)
    assert n.dtype == torch.int32
    return n.tolist()


# ---------------------------------------------------------------- skip_counts: threshold rule


@pytest.mark.parametrize(
    "m, betas, expected",
    [
        # shares of the lowest 1, 2, 3: 0.1, 0.3, 0.6
        (3, [0.15, 0.35, 0.65], 1),  # every size passes: skip 3
        (2, [0.15, 0.35, 0.65], 2),  # max_skip caps it
        (1, [0.15, 0.35, 0.65], 3),
        (3, [0.05, 0.35, 0.5], 2),  # the largest passing size, even when a smaller one fails
        (3, [0.05, 0.25, 0.5], 4),  # none passes: keep all
        (3, [0.0, 0.0, 0.0], 4),  # zero thresholds never skip
        (9, [0.15, 0.35, 0.65], 1),  # max_skip past k - 1 is k - 1: one expert always stays
    ],
)
def test_threshold_rule(m, betas, expected):
    assert counts([[0.4, 0.3, 0.2, 0.1]], threshold(m, betas)) == [expected]


def test_threshold_rule_reads_shares_in_any_order_and_scale():
    skip = threshold(3, [0.15, 0.35, 0.65])
    assert counts([[1.0, 4.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.4]], skip) == [1, 1]


def test_threshold_rule_is_strict():
    # lowest share exactly 0.125: not under a threshold of 0.125
    assert counts([DYADIC], threshold(1, [0.125, 0.5, 0.9])) == [4]
    assert counts([DYADIC], threshold(1, [0.1251, 0.5, 0.9])) == [3]


def test_threshold_rule_ties_and_equal_weights():
    # equal weights: the i lowest hold i / k
    equal = [[0.25] * 4]
    assert counts(equal, threshold(3, [0.25, 0.5, 0.75])) == [4]
    assert counts(equal, threshold(3, [0.3, 0.4, 0.8])) == [1]  # sizes 1 and 3 pass
    assert counts(equal, threshold(2, [0.3, 0.4, 0.8])) == [3]
    # ties at the cut: the share does not depend on which tied expert goes
    assert counts([[0.3, 0.3, 0.2, 0.2]], threshold(3, [0.25, 0.45, 0.5])) == [2]


def test_threshold_rule_k2_is_lu_et_al():
    # k = 2: skip the second expert when its share is under beta_1
    assert counts([[0.8, 0.2], [0.6, 0.4], [0.5, 0.5]], threshold(1, [0.3])) == [1, 2, 2]


# ---------------------------------------------------------------- skip_counts: budget rule


@pytest.mark.parametrize(
    "m, share, expected",
    [
        (3, 0.75, 2),  # the top 2 hold exactly 0.75: reached
        (3, 0.76, 3),
        (3, 0.875, 3),
        (3, 1.0, 4),
        (3, 0.1, 1),
        (1, 0.1, 3),  # never fewer than k - m
        (2, 0.1, 2),
        (7, 0.1, 1),  # max_skip past k - 1
    ],
)
def test_budget_rule(m, share, expected):
    assert counts([DYADIC, DYADIC[::-1]], budget(m, share)) == [expected, expected]


def test_budget_rule_equal_weights():
    assert counts([[0.25] * 4, [2.0] * 4], budget(3, 0.5)) == [2, 2]
    assert counts([[0.25] * 4], budget(3, 0.51)) == [3]


def test_order_by_weight_is_stable_and_keeps_sorted_rows():
    index = torch.tensor([[5, 2, 7, 1], [0, 1, 2, 3]])
    weights = torch.tensor([[0.2, 0.3, 0.2, 0.3], [0.4, 0.3, 0.2, 0.1]])
    sorted_index, sorted_weights = order_by_weight(index, weights)
    assert sorted_index.tolist() == [[2, 1, 5, 7], [0, 1, 2, 3]]
    assert torch.equal(sorted_weights, torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.4, 0.3, 0.2, 0.1]]))


# ---------------------------------------------------------------- calibration statistics


def test_router_stats_maps_equal_a_direct_computation():
    model = make_moe("qwen3_moe")
    stats = RouterStats(model)
    gen = torch.Generator().manual_seed(0)
    raw = {layer: torch.rand(101, 4, generator=gen) for layer in (0, 1)}
    for layer, w in raw.items():
        stats.add(layer, w[:50])
        stats.add(layer, w[50:])
    maps, budgets = stats.threshold_maps(), stats.budgets(max_skip=1)
    assert maps.shape == (2, 3) and budgets.shape == (2,)
    for row, w in enumerate(raw.values()):
        w = w.double().numpy()
        asc = np.sort(w, axis=1) / w.sum(axis=1, keepdims=True)
        for m in (1, 2, 3):
            assert maps[row, m - 1].item() == pytest.approx(np.median(asc[:, :m].sum(1)), abs=1e-6)
        assert budgets[row].item() == pytest.approx(np.median(asc[:, 1:].sum(1)), abs=1e-6)


def test_router_stats_hooks_record_what_the_router_hands_the_experts():
    model = make_model("qwen3_moe", num_experts=8, num_experts_per_tok=4)
    assert sorted(experts_layers(model).values()) == [0, 1]
    seen = {}  # independent capture: the router's own outputs (logits, top-k weights, top-k ids)

    def capture(layer):
        def hook(module, args, out):
            seen[layer] = out[1].detach()

        return hook

    hooks = [layer.mlp.gate.register_forward_hook(capture(i)) for i, layer in enumerate(model.model.layers)]
    ids = torch.randint(3, VOCAB, (2, 9))
    with RouterStats(model) as stats, torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    assert stats.layers == [0, 1] and not model.model.layers[0].mlp.experts._forward_pre_hooks
    for row, layer in enumerate(stats.layers):
        w = seen[layer].double().numpy()
        asc = np.sort(w, axis=1) / w.sum(axis=1, keepdims=True)
        direct = [np.median(asc[:, :m].sum(1)) for m in (1, 2, 3)]
        np.testing.assert_allclose(stats.threshold_maps()[row].numpy(), direct, atol=1e-6)


# ---------------------------------------------------------------- the experts function under a verify step


def verify_step(ids: torch.Tensor, skips: dict[int, MoESkip]) -> StepContext:
    zeros = torch.zeros(ids.shape[0], dtype=torch.int64)
    return StepContext("verify", zeros, zeros, ids.shape[1], ids.shape[1], verify_sparsity=ExpertSkips(skips))


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_skipping_nothing_is_dense_exactly(arch):
    model = make_moe(arch)
    ids = torch.randint(3, VOCAB, (2, 7))
    with decoding_experts(model, expert_skipping=True), torch.no_grad():
        dense = model(ids).logits
        with step_scope(verify_step(ids, {0: threshold(1, [0.0]), 1: budget(1, 1.0)})):
            skipped_nothing = model(ids).logits
    assert torch.equal(skipped_nothing, dense)
    model.set_experts_implementation("eager")
    with torch.no_grad():
        torch.testing.assert_close(dense, model(ids).logits, rtol=1e-5, atol=1e-5)


def make_k4(arch: str) -> torch.nn.Module:
    """8 experts, 4 per token; expert weights scaled up (like conftest's 2-D ones) so that the experts matter."""
    if arch == "mixtral":
        model = make_model(arch, num_local_experts=8, num_experts_per_tok=4)
    else:
        model = make_model(arch, num_experts=8, num_experts_per_tok=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 3:
                p.mul_(16.0)
    return model


def dropped_reference(module, x, index, weights, n_active) -> torch.Tensor:
    """Each token's ``n_active`` highest-weight experts, one at a time, unrenormalised weights, float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = module.down_proj.shape[-1]
    for t in range(x.shape[0]):
        order = torch.argsort(weights[t], descending=True, stable=True)[: n_active[t]]
        for r in order.tolist():
            e = int(index[t, r])
            gate_up = module.gate_up_proj[e].double() @ x[t].double()
            h = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += weights[t, r].double() * (module.down_proj[e].double() @ h)
    return out


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("fallback", [False, True], ids=["fused_op", "batched_mm_fallback"])
def test_skipping_equals_a_reference_that_drops_the_experts(arch, fallback):
    model = make_k4(arch)
    record_layers(model)
    module = model.model.layers[1].mlp.experts
    if fallback:  # a module the fused op declines: batched_mm with zeroed weights
        module = copy.deepcopy(module)
        module.has_post_expert_norm, module.post_expert_norm = True, torch.nn.Identity()
        fused._LAYERS[module] = 1  # the copy is no part of the model: give it its layer by hand
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(11, 64, generator=gen)
    index = torch.stack([torch.randperm(8, generator=gen)[:4] for _ in range(11)])
    weights = torch.rand(11, 4, generator=gen)  # unsorted, unnormalised
    skip = budget(3, 0.6)
    n_active = skip_counts(weights, skip)
    assert len(set(n_active.tolist())) > 1  # tokens keep different numbers of experts
    with torch.no_grad():
        dense = fused_experts_forward(module, x, index, weights)
        with step_scope(verify_step(x[None, :, 0], {1: skip})):
            sparse = fused_experts_forward(module, x, index, weights)
        with step_scope(verify_step(x[None, :, 0], {0: skip})):  # another layer's skip
            other_layer = fused_experts_forward(module, x, index, weights)
    close = dict(rtol=1e-4, atol=1e-4)  # float32 against float64
    torch.testing.assert_close(
        sparse.double(), dropped_reference(module, x, index, weights, n_active), **close
    )
    torch.testing.assert_close(
        dense.double(), dropped_reference(module, x, index, weights, [4] * 11), **close
    )
    assert torch.equal(other_layer, dense)
    assert (sparse - dense).abs().amax() > 0.1


def kept_by_hand(index, weights, group: int, row_experts: int, min_keep: int) -> list[set[int]]:
    """The row_union rule written out per row with Python dicts and sorts: each token's kept experts."""
    kept = []
    for r in range(0, index.shape[0], group):
        summed: dict[int, float] = {}
        for t in range(r, r + group):
            for e, w in zip(index[t].tolist(), weights[t].tolist()):
                summed[e] = summed.get(e, 0.0) + w
        chosen = set(sorted(summed, key=lambda e: (-summed[e], e))[:row_experts])
        for t in range(r, r + group):
            pairs = sorted(zip(weights[t].tolist(), index[t].tolist()), key=lambda p: -p[0])
            mine = {e for _, e in pairs if e in chosen}
            for _, e in pairs:  # never fewer than min_keep: the heaviest others join
                if len(mine) >= min_keep:
                    break
                mine.add(e)
            kept.append(mine)
    return kept


@pytest.mark.parametrize(
    "tokens, group, k, experts, max_skip, row_experts",
    [(8, 8, 4, 16, 3, 4), (14, 7, 4, 8, 2, 3), (6, 3, 8, 32, 7, 1), (5, 1, 4, 8, 3, 2), (8, 4, 2, 64, 1, 1)],
)
def test_row_union_keeps_the_rows_heaviest_experts(tokens, group, k, experts, max_skip, row_experts):
    gen = torch.Generator().manual_seed(tokens + 10 * k + experts)
    index = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=gen)
    skip = MoESkip("row_union", max_skip, torch.tensor(float(row_experts)))
    out_index, out_weights, n_active = row_union(index, weights, skip, group)
    expected = kept_by_hand(index, weights, group, row_experts, k - max_skip)
    for t in range(tokens):
        n = int(n_active[t])
        assert set(out_index[t, :n].tolist()) == expected[t]
        assert sorted(zip(out_index[t].tolist(), out_weights[t].tolist())) == sorted(
            zip(index[t].tolist(), weights[t].tolist())
        )  # a permutation of the token's pairs
    if max_skip == k - 1:  # only a token's own top expert may join the set: few distinct experts per row
        for r in range(0, tokens, group):
            distinct = {e for t in range(r, r + group) for e in out_index[t, : int(n_active[t])].tolist()}
            assert len(distinct) <= row_experts + group


def test_row_union_of_one_set_per_row_equals_a_reference_that_drops_the_experts():
    model = make_k4("qwen3_moe")
    record_layers(model)
    module = model.model.layers[1].mlp.experts
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(12, 64, generator=gen)  # 2 rows of 6 verify tokens
    index = torch.stack([torch.randperm(8, generator=gen)[:4] for _ in range(12)])
    weights = torch.rand(12, 4, generator=gen)
    skip = MoESkip("row_union", 3, torch.tensor(3.0))
    with torch.no_grad():
        with step_scope(verify_step(x[:, :1].reshape(2, 6), {1: skip})):
            sparse = fused_experts_forward(module, x, index, weights)
    expected = kept_by_hand(index, weights, 6, 3, 1)
    reference = torch.zeros(x.shape, dtype=torch.float64)
    inter = module.down_proj.shape[-1]
    for t in range(12):
        for e, w in zip(index[t].tolist(), weights[t].tolist()):
            if e in expected[t]:
                gate_up = module.gate_up_proj[e].double() @ x[t].double()
                h = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
                reference[t] += w * (module.down_proj[e].double() @ h)
    assert sum(len(s) for s in expected) < 48  # experts were dropped
    torch.testing.assert_close(sparse.double(), reference, rtol=1e-4, atol=1e-4)


def test_row_union_settings():
    cfg = LossySparseVerify(attention=None, moe=SparseMoE(rule="row_union", max_skip=7, row_experts=8))
    assert not cfg.needs_calibration()
    assert LossySparseVerify.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="needs row_experts"):
        SparseMoE(rule="row_union", max_skip=7)
    with pytest.raises(ValueError, match="row_union' only"):
        SparseMoE(rule="budget", max_skip=2, budget=0.5, row_experts=4)
    with pytest.raises(ValueError, match="row_experts must be an int >= 1"):
        SparseMoE(rule="row_union", max_skip=2, row_experts=0)


@needs_triton
def test_fused_kernel_is_handed_n_active(monkeypatch):
    """The work is saved in the kernel: it receives each token's count and the pairs in weight order."""
    seen, launch = [], kernel_module.launch

    def spy(hidden, w_gate_up, w_down, index, weights, n_active, transposed, residual=None):
        seen.append((index, weights, n_active))
        return launch(hidden, w_gate_up, w_down, index, weights, n_active, transposed, residual=residual)

    monkeypatch.setattr(kernel_module, "launch", spy)
    model = make_k4("qwen3_moe")
    ids = torch.randint(3, VOCAB, (2, 5))
    with decoding_experts(model, expert_skipping=True), torch.no_grad():
        with step_scope(verify_step(ids, {1: budget(3, 0.5)})):
            model(ids)
    (_, _, dense_layer), (index, weights, n_active) = seen
    assert dense_layer is None and n_active.shape == (10,) and bool((n_active < 4).any())
    assert torch.equal(n_active, skip_counts(weights, budget(3, 0.5)))
    assert bool((weights[:, :-1] >= weights[:, 1:]).all())


def test_lossless_and_draft_steps_skip_nothing():
    model = make_k4("qwen3_moe")
    record_layers(model)
    module = model.model.layers[0].mlp.experts
    x, index = torch.randn(3, 64), torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [1, 3, 5, 7]])
    weights = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 3)
    with torch.no_grad():
        dense = fused_experts_forward(module, x, index, weights)
        step = verify_step(x[None, :, 0], {0: budget(3, 0.5)})
        step.phase = type(step.phase)("draft")
        with step_scope(step):
            assert torch.equal(fused_experts_forward(module, x, index, weights), dense)


def test_unrecorded_experts_module_is_refused_under_skipping():
    module = make_k4("qwen3_moe").model.layers[0].mlp.experts  # never switched: no layer recorded
    x, index, weights = torch.randn(2, 64), torch.tensor([[0, 1, 2, 3]] * 2), torch.rand(2, 4)
    fused_experts_forward(module, x, index, weights)  # no step: fine
    with (
        step_scope(verify_step(x[None, :, 0], {0: budget(1, 0.5)})),
        pytest.raises(RuntimeError, match="layer"),
    ):
        fused_experts_forward(module, x, index, weights)


def test_expert_skipping_switch_replaces_user_choices_and_restores_them():
    model = make_moe("olmoe")
    model.set_experts_implementation("batched_mm")
    with decoding_experts(model, expert_skipping=True):
        assert model.get_experts_implementation() == {"": "hsv_fused"}
    assert model.get_experts_implementation() == {"": "batched_mm"}


# ---------------------------------------------------------------- damage and calibration


@pytest.fixture(scope="module")
def k4_text():
    """A k = 4 model and text it generated greedily (so its own NLL on it is low and skipping raises it)."""
    model = make_k4("qwen3_moe")
    prompt = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(3))
    ids = model.generate(prompt, max_new_tokens=18, do_sample=False, min_new_tokens=18)
    return model, ids


def test_measure_damage(k4_text):
    model, ids = k4_text
    none = measure_damage(model, ids, {})
    assert none["damage"] == 0.0 and none["tokens"] == ids.numel() - ids.shape[0]
    nothing = measure_damage(model, ids, {0: threshold(3, [0.0] * 3), 1: threshold(3, [0.0] * 3)})
    assert nothing["damage"] == 0.0
    heavy = measure_damage(model, ids, {0: budget(3, 0.01), 1: budget(3, 0.01)})
    assert heavy["dense_nll"] == none["dense_nll"]
    assert heavy["damage"] > 0.01


def test_calibrate_moe(k4_text):
    model, ids = k4_text
    cal = calibrate_moe(model, [ids[:1], ids[1:]], SparseMoE(max_skip=2, max_damage=10.0), progress=False)
    assert cal.layers == [0, 1] and cal.values.shape == (2, 3)
    assert cal.damage > 0
    assert set(cal.skips()) == {0, 1} and cal.skips()[1].values.shape == (3,)
    summary = cal.summary  # the SparseCalibration `moe` entry
    assert summary["layers"] == [0, 1] and summary["k"] == 4 and set(summary["budgets"]) == {"1", "2", "3"}
    assert summary["thresholds"] == cal.values.tolist() and summary["damage"] == {"threshold:2": cal.damage}
    cal = calibrate_moe(model, [ids], SparseMoE(rule="budget", max_skip=3, max_damage=10.0), progress=False)
    assert cal.values.shape == (2,) and bool(((cal.values > 0) & (cal.values <= 1)).all())
    with pytest.raises(
        ValueError, match=r"max_skip=3 \(budget:3\) raises the calibration NLL by .* lower max_skip"
    ):
        calibrate_moe(
            model, [ids], SparseMoE(rule="budget", max_skip=3, budget=0.01, max_damage=0.0), progress=False
        )
    with pytest.raises(ValueError, match="must be below the 4 experts"):
        calibrate_moe(model, [ids], SparseMoE(max_skip=4), progress=False)


def test_calibrate_row_union_measures_rows_of_window_tokens(k4_text, monkeypatch):
    from hf_sparse_verify.sparse.calibration import SparseCalibration
    from hf_sparse_verify.sparse.state import SparseVerifyState

    model, ids = k4_text  # [2, 24]
    groups, real = [], fused.expert_skip
    monkeypatch.setattr(
        fused,
        "expert_skip",
        lambda i, w, skip, group: groups.append((i.shape[0], group)) or real(i, w, skip, group),
    )
    cfg = SparseMoE(rule="row_union", max_skip=3, row_experts=2, max_damage=10.0)
    cal = calibrate_moe(model, [ids], cfg, progress=False, window=5)
    assert set(groups) == {(2 * 20, 5)}  # rows cut to 20 tokens, windows of 5 that never straddle two rows
    assert cal.damage > 0.01 and cal.summary["damage"] == {"row_union:3:2": cal.damage}
    assert cal.values.tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match=r"\(row_union:3:2\) raises the calibration NLL"):
        calibrate_moe(model, [ids], dataclasses.replace(cfg, max_damage=0.0), progress=False, window=5)
    # a calibration that measured this setting refuses it past the bound when verification starts
    calibration = SparseCalibration("qwen3_moe", 2, moe=cal.summary)
    bounded = LossySparseVerify(attention=None, moe=dataclasses.replace(cfg, max_damage=0.0))
    with pytest.raises(ValueError, match="raised the calibration NLL"):
        SparseVerifyState(bounded, 2, calibration, [torch.device("cpu")] * 2)
    SparseVerifyState(bounded, 2, None, [torch.device("cpu")] * 2)  # nothing measured


def test_docstring_examples():
    import doctest

    import hf_sparse_verify.kernels.expert_skip.naive as reference
    import hf_sparse_verify.sparse.calibration as calibration
    import hf_sparse_verify.sparse.moe as slot

    results = [doctest.testmod(module) for module in (reference, slot, calibration)]
    assert sum(r.attempted for r in results) >= 6 and sum(r.failed for r in results) == 0


def test_row_union_through_generate(monkeypatch):
    """In ``generate``, rows are the verify step's q_len tokens: a set holding all 8 experts is dense verification
    (token-identical to plain generate in float32), and a 1-expert set makes verify steps drop experts."""
    import hf_sparse_verify as hsv

    seen, real = [], fused.expert_skip

    def spy(index, weights, skip, group):
        out = real(index, weights, skip, group)
        seen.append((index.shape[0], group, out[2]))
        return out

    monkeypatch.setattr(fused, "expert_skip", spy)
    model = make_k4("qwen3_moe")
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 24))

    def run(row_experts: int):
        cfg = LossySparseVerify(
            attention=None, moe=SparseMoE(rule="row_union", max_skip=3, row_experts=row_experts)
        )
        seen.clear()
        return model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
            custom_generate=hsv.generate,
            speculation=dict(strategy="prompt_lookup", num_draft_tokens=4, lossy_sparse_verify=cfg),
        )  # fmt: skip

    plain = model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False
    )
    assert torch.equal(run(8), plain)
    assert seen and all(bool((n == 4).all()) for _, _, n in seen)
    run(1)
    assert {(tokens, group) for tokens, group, _ in seen} <= {(2 * q, q) for q in range(1, 6)}
    assert any(group > 1 and bool((n < 4).any()) for _, group, n in seen)
