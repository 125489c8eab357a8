"""Sparse FFN through `GatedMLP` (CPU, float32, tiny random models): bitwise dense without sparsity, tau = 0 is
dense, a huge tau zeroes the MLP, a moderate tau equals the zeroed-channel reference with one mask per row, the
replacement is undone on exit, each replaceable transformers MLP equals its replacement, and the calibration."""

from __future__ import annotations

import doctest

import pytest
import torch
from conftest import make_model
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeConfig, Qwen2MoeMLP
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeConfig, Qwen3MoeMLP

import hf_sparse_verify.drivers.ffn_stats as ffn_module
import hf_sparse_verify.integrations.switch as switch_module
from hf_sparse_verify.drivers.ffn_stats import FFNStats, skipped_share
from hf_sparse_verify.integrations import GatedMLP, Mode, replaceable_mlp, speculation_mode
from hf_sparse_verify.integrations.mlp import REPLACEABLE as MLP_REPLACEABLE
from hf_sparse_verify.kernels.sparse_ffn import sparse_mlp_naive
from hf_sparse_verify.step import StepContext, VerifySparsity, step_scope

#: the sparse FFN replacements alone (these forwards run the model's own attention)
SPARSE_FFN = Mode(attention=False, sparse_ffn=True)


class FixedTau(VerifySparsity):
    """One threshold for every layer (None: dense), recording which layers asked."""

    def __init__(self, tau: float | None):
        self.tau = None if tau is None else torch.tensor(float(tau))
        self.asked: list[int] = []

    def ffn_tau(self, layer: int) -> torch.Tensor | None:
        self.asked.append(layer)
        return self.tau


def verify_step(
    batch: int, q_len: int, sparsity: VerifySparsity | None, phase: str = "verify"
) -> StepContext:
    start = torch.full((batch,), 5, dtype=torch.int64)
    pad = torch.zeros(batch, dtype=torch.int64)
    return StepContext(
        phase=phase, start=start, pad=pad, q_len=q_len, kv_len=5 + q_len, verify_sparsity=sparsity
    )


def llama(seed: int = 0, **overrides) -> torch.nn.Module:
    return make_model("llama", seed=seed, **overrides)


def midway_tau(act: torch.Tensor) -> float:
    """A tau that skips about half of each row's channels, midway between two row maxima of ``|act|`` ``[B, q, I]``:
    no value sits at tau, so a different summation order (kernels against the reference) cannot flip a channel."""
    row_max = act.abs().amax(dim=1).flatten().sort().values
    mid = row_max.numel() // 2
    return float((row_max[mid - 1] + row_max[mid]) / 2)


def weights(mlp):
    return mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight


def test_replaced_model_is_bitwise_dense_without_sparsity():
    model = llama()
    ids = torch.randint(3, 90, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        with speculation_mode(model, mode=SPARSE_FFN) as switched:
            assert switched.counts == {"GatedMLP": 2} and all(
                isinstance(layer.mlp, GatedMLP) for layer in model.model.layers
            )
            assert torch.equal(model(ids).logits, expected)  # no step
            for step in (verify_step(2, 9, None), verify_step(2, 9, FixedTau(0.5), phase="draft")):
                with step_scope(step):  # a verify step without sparsity; sparsity outside verify steps
                    assert torch.equal(model(ids).logits, expected)


def test_tau_zero_is_dense_and_huge_tau_is_zero():
    model = llama()
    mlp = model.model.layers[1].mlp
    x = torch.randn(3, 4, 64)
    with torch.no_grad():
        dense = mlp(x)
        replaced = GatedMLP(mlp, layer_idx=1)
        sparsity = FixedTau(0.0)
        with step_scope(verify_step(3, 4, sparsity)):
            torch.testing.assert_close(replaced(x), dense, rtol=1e-5, atol=1e-5)
        assert sparsity.asked == [1]
        with step_scope(verify_step(3, 4, FixedTau(1e9))):
            assert torch.equal(replaced(x), torch.zeros_like(x))


@pytest.mark.parametrize("batch, q_len", [(1, 1), (2, 3), (3, 6)])
def test_moderate_tau_equals_zeroed_channel_reference(batch, q_len):
    model = llama(seed=batch)
    mlp = model.model.layers[0].mlp
    x = torch.randn(batch, q_len, 64, generator=torch.Generator().manual_seed(q_len))
    with torch.no_grad():
        act = mlp.act_fn(mlp.gate_proj(x))
        tau = midway_tau(act)
        share = float(skipped_share(act, tau))
        assert 0.3 < share < 0.7
        with step_scope(verify_step(batch, q_len, FixedTau(tau))):
            out = GatedMLP(mlp, layer_idx=0)(x)
        expected = sparse_mlp_naive(x, *weights(mlp), torch.tensor(tau))
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out, mlp(x), atol=1e-3)  # the threshold changed the output


def test_mask_is_shared_by_the_rows_tokens():
    """Channel 0 is active (large gate input) only in token 0 of row 0: it is computed for every token of row 0
    (its contribution is in each token's output) and for no token of row 1."""
    torch.manual_seed(0)
    hidden, inter = 8, 4
    mlp = llama(hidden_size=hidden, intermediate_size=inter, num_attention_heads=2, num_key_value_heads=1)
    mlp = mlp.model.layers[0].mlp
    with torch.no_grad():
        mlp.gate_proj.weight.zero_()
        # the gate of channel 0 reads hidden dim 0 only; the other gates are silu(0) = 0
        mlp.gate_proj.weight[0, 0] = 1.0
        x = torch.randn(2, 3, hidden) * 0.1
        x[..., 0] = 0.0
        x[0, 0, 0] = 10.0  # silu(10) ~ 10 >= tau in token 0 of row 0 only
        x[:, 1:, 0] = 0.05  # small but non-zero gate elsewhere: silu(0.05) ~ 0.026 < tau
        x[1, :, 0] = 0.05
        act = mlp.act_fn(mlp.gate_proj(x))
        up = mlp.up_proj(x)
        with step_scope(verify_step(2, 3, FixedTau(1.0))):
            out = GatedMLP(mlp, layer_idx=0)(x)
        only_channel_0 = (act[..., :1] * up[..., :1]) @ mlp.down_proj.weight[:, :1].T  # [2, 3, H]
        torch.testing.assert_close(out[0], only_channel_0[0], rtol=1e-5, atol=1e-6)
        assert only_channel_0[0, 1:].abs().max() > 1e-4  # tokens 1, 2 of row 0 really get channel 0's share
        assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_replacement_undone_on_exit_and_on_errors():
    model = llama()
    before = {name: type(m) for name, m in model.named_modules()}
    state = set(model.state_dict())
    with speculation_mode(model, mode=SPARSE_FFN):
        assert set(model.state_dict()) == state  # same keys: the projections are shared, not copied
        assert model.model.layers[0].mlp.gate_proj.weight is model.model.layers[0].mlp.gate_proj.weight
    assert {name: type(m) for name, m in model.named_modules()} == before
    with pytest.raises(RuntimeError, match="boom"), speculation_mode(model, mode=SPARSE_FFN):
        assert isinstance(model.model.layers[0].mlp, GatedMLP)
        raise RuntimeError("boom")
    assert {name: type(m) for name, m in model.named_modules()} == before


def test_fused_mode_keeps_cpu_mlps():
    """On CPU the fused dense kernel does not run, so the fused mode leaves the MLPs; with the sparse FFN on as well
    they are replaced, and everything is restored."""
    model = llama()
    with speculation_mode(model, mode=Mode(attention=False, fused=True)):
        assert not any(isinstance(m, GatedMLP) for m in model.modules())
    with speculation_mode(model, mode=Mode(attention=False, fused=True, sparse_ffn=True)) as switched:
        assert switched.counts["GatedMLP"] == 2
    assert not any(isinstance(m, GatedMLP) for m in model.modules())


def _moe_mlp(cls, config_cls):
    config = config_cls(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                        num_hidden_layers=1, vocab_size=50)  # fmt: skip
    return cls(config, intermediate_size=40)


CHECKED = {
    "LlamaMLP": lambda: llama().model.layers[0].mlp,
    "MistralMLP": lambda: make_model("mistral").model.layers[0].mlp,
    "Qwen2MLP": lambda: make_model("qwen2").model.layers[0].mlp,
    "Qwen3MLP": lambda: make_model("qwen3").model.layers[0].mlp,
    "Qwen2MoeMLP": lambda: _moe_mlp(Qwen2MoeMLP, Qwen2MoeConfig),
    "Qwen3MoeMLP": lambda: _moe_mlp(Qwen3MoeMLP, Qwen3MoeConfig),
}


def test_every_replaceable_class_is_checked():
    assert set(CHECKED) == set(MLP_REPLACEABLE)


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_replacement_equals_transformers_module(name):
    mlp = CHECKED[name]()
    assert type(mlp).__name__ == name and replaceable_mlp(mlp)
    hidden = mlp.gate_proj.weight.shape[1]
    x = torch.randn(2, 5, hidden)
    with torch.no_grad():
        replaced = GatedMLP(mlp, layer_idx=0)
        assert torch.equal(replaced(x), mlp(x))  # dense on CPU: the same arithmetic
        with step_scope(verify_step(2, 5, FixedTau(0.0))):
            torch.testing.assert_close(replaced(x), mlp(x), rtol=1e-5, atol=1e-5)


def test_biased_or_non_silu_mlps_are_not_replaced():
    assert not replaceable_mlp(llama(mlp_bias=True).model.layers[0].mlp)
    gelu = llama(hidden_act="gelu")
    assert not replaceable_mlp(gelu.model.layers[0].mlp)
    with speculation_mode(gelu, mode=SPARSE_FFN) as switched:
        assert switched.counts == {}
    with pytest.raises(ValueError, match="bias-free SiLU"):
        GatedMLP(gelu.model.layers[0].mlp, 0)


def test_sparse_path_needs_rows_and_tokens():
    mlp = GatedMLP(llama().model.layers[0].mlp, layer_idx=0)
    with step_scope(verify_step(1, 4, FixedTau(0.1))), pytest.raises(ValueError, match="verify tokens"):
        mlp(torch.randn(4, 64))


def assert_share(stats, values, tau, sparsity):
    """The histogram's guarantee: ``sparsity`` lies between the true shares under the edges of tau's bin (one bin
    is a 0.5% ratio, but |silu| piles up at its minimum 0.2785, so a bin can hold many values), and the share under
    tau is near ``sparsity``."""
    j = int(torch.searchsorted(stats.edges, torch.tensor([tau], dtype=torch.float64), right=True)[0])
    lo, hi = float(stats.edges[j - 1]), float(stats.edges[j])
    assert float((values < lo).double().mean()) <= sparsity <= float((values < hi).double().mean())
    assert abs(float((values < tau).double().mean()) - sparsity) < 0.02


def test_ffn_stats_thresholds_match_the_share():
    model = llama(num_hidden_layers=3)
    ids = torch.randint(3, 90, (3, 20), generator=torch.Generator().manual_seed(0))
    recorded: dict[int, list[torch.Tensor]] = {i: [] for i in range(3)}
    hooks = [
        layer.mlp.act_fn.register_forward_hook(
            lambda m, i, o, idx=idx: recorded[idx].append(o.abs().flatten())
        )
        for idx, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad(), FFNStats(model) as stats:
        model(ids)
    for hook in hooks:
        hook.remove()
    for sparsity in (0.3, 0.5, 0.8):
        taus = stats.thresholds(sparsity)
        assert len(taus) == 3
        for layer, tau in enumerate(taus):
            values = torch.cat(recorded[layer])
            assert values.numel() == 3 * 20 * 96
            assert_share(stats, values, tau, sparsity)
            assert abs(stats.share_under(layer, tau) - sparsity) < 1e-6
    assert stats.thresholds(0.0) == [0.0, 0.0, 0.0]
    model(ids)  # detached on exit: no more counts
    assert int(stats.counts[0].sum()) == 3 * 20 * 96


def test_ffn_stats_group_matches_the_row_mask():
    """With ``group = q`` the calibrated share is the share of channels a verify row of q tokens skips."""
    model = llama()
    ids = torch.randint(3, 90, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), FFNStats(model, group=4) as stats:
        model(ids)
    tau = stats.thresholds(0.5)[1]
    mlp = model.model.layers[1].mlp
    captured = []
    hook = mlp.act_fn.register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        model(ids)
    hook.remove()
    act = captured[0].reshape(2 * 4, 4, -1)  # rows of 4 consecutive tokens
    assert_share(stats, act.abs().amax(dim=1).flatten(), tau, 0.5)
    assert abs(float(skipped_share(act, tau)) - 0.5) < 0.02


def test_ffn_stats_input_checks():
    with pytest.raises(ValueError, match="group"):
        FFNStats(llama(), group=0)
    with pytest.raises(ValueError, match="no bias-free SiLU"):
        FFNStats(llama(hidden_act="gelu"))
    stats = FFNStats(llama())
    with pytest.raises(RuntimeError, match="recorded nothing"):
        stats.thresholds(0.5)
    with pytest.raises(ValueError, match="sparsity"):
        stats.threshold(0, 1.0)


def test_docstring_examples():
    for module in (switch_module, ffn_module):
        results = doctest.testmod(module, extraglobs={"torch": torch, "LlamaConfig": LlamaConfig,
                                                      "LlamaForCausalLM": LlamaForCausalLM})  # fmt: skip
        assert results.attempted >= 1 and results.failed == 0


def test_transposed_copies_follow_their_weight():
    from hf_sparse_verify.integrations.mlp import _TRANSPOSED, transposed_copy

    a, b = torch.randn(6, 4), torch.randn(6, 4)
    assert torch.equal(transposed_copy(a), a.T) and torch.equal(transposed_copy(b), b.T)
    assert transposed_copy(a) is transposed_copy(a)  # built once
    with torch.no_grad():
        a.mul_(2)  # changed in place: rebuilt
    assert torch.equal(transposed_copy(a), a.T)
    key = id(b)
    del b
    assert key not in _TRANSPOSED


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the sparse FFN kernels and the batched fallback run on CUDA"
)
@pytest.mark.parametrize("batch, q_len", [(1, 16), (1, 5), (2, 4), (8, 16)])
def test_gpu_sparse_path_equals_zeroed_channel_reference(batch, q_len):
    """On CUDA one batch row runs the Triton kernels and larger batches the dense masked fallback
    (`SPARSE_KERNEL_MAX_BATCH`); both equal the zeroed-channel reference in float32."""
    from hf_sparse_verify.integrations.mlp import SPARSE_KERNEL_MAX_BATCH

    assert SPARSE_KERNEL_MAX_BATCH < 2 <= 8  # the cases above cover both paths
    model = llama(seed=batch).cuda()
    mlp = model.model.layers[0].mlp
    x = torch.randn(batch, q_len, 64, generator=torch.Generator().manual_seed(q_len)).cuda()
    with torch.no_grad():
        tau = midway_tau(mlp.act_fn(mlp.gate_proj(x)))
        with step_scope(verify_step(batch, q_len, FixedTau(tau))):
            out = GatedMLP(mlp, layer_idx=0)(x)
        expected = sparse_mlp_naive(x.double(), *(w.double() for w in weights(mlp)), torch.tensor(tau))
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(out, mlp(x), atol=1e-3)  # the threshold changed the output
