"""Hybrid models with recurrent layers: short convolutions (LFM2's ``conv`` layers) and linear attention (Qwen3-Next's
Gated DeltaNet: a short convolution, then a recurrent state). The cache keeps each slot's convolution input and the
recurrent state after each of the last slots (`SpecConvLayer`), and linear-attention layers run verify steps one
token at a time (`TokenByToken`), so rejected drafts roll back as the KV does. Layers with a mixer beside their
attention (Falcon-H1, Zamba's hybrid layers: ``hybrid`` cache layers) keep both (`SpecHybridLayer`). Greedy output equals plain
``generate`` (float32, a ragged batch) with drafts rejected part-way, also when the prompt is prefilled in chunks;
self-speculation is refused with the reason."""

from __future__ import annotations

import contextlib

import pytest
import torch
from arch_survey import build
from conftest import copy_prompt, equal_plain, noisy_copy, sharpen, strategy_equals_plain
from transformers import (
    AutoModelForCausalLM,
    BambaConfig,
    FalconH1Config,
    FalconMambaConfig,
    GraniteMoeHybridConfig,
    JambaConfig,
    Lfm2Config,
    Lfm2MoeConfig,
    MambaConfig,
    Qwen3NextConfig,
    Zamba2Config,
    ZambaConfig,
)

import hf_sparse_verify as hsv
from hf_sparse_verify.attention.cache import SpecCache, SpecConvLayer
from hf_sparse_verify.generation.engine import runner as runner_module
from hf_sparse_verify.step import Phase, StepContext, step_scope

LAYER_TYPES = ["conv", "full_attention", "conv", "conv"]


def _hybrid(kind: str = "lfm2", seed: int = 0) -> torch.nn.Module:
    sizes = dict(vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, layer_types=LAYER_TYPES, conv_L_cache=3, pad_token_id=0, eos_token_id=1,
                 bos_token_id=2)  # fmt: skip
    if kind == "qwen3_next":
        config = Qwen3NextConfig(
            vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8,
            layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    elif kind == "bamba":  # Mamba-2 mixers around one attention layer
        config = BambaConfig(
            vocab_size=99, hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
            mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, pad_token_id=0, eos_token_id=1,
            bos_token_id=2,
        )  # fmt: skip
    elif kind == "jamba":  # Mamba-1 mixers, experts on the last layer
        config = JambaConfig(
            vocab_size=99, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, attn_layer_period=3, attn_layer_offset=1, expert_layer_period=3,
            expert_layer_offset=2, num_experts=2, num_experts_per_tok=1, mamba_d_state=8, mamba_d_conv=4,
            mamba_expand=2, mamba_dt_rank=4, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    elif kind == "granitemoehybrid":  # Granite 4: Mamba-2 layers and experts
        config = GraniteMoeHybridConfig(
            vocab_size=99, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=4, mamba_d_head=16,
            mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
            num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32, pad_token_id=0, eos_token_id=1,
            bos_token_id=2,
        )  # fmt: skip
    elif kind == "falcon_h1":  # a Mamba-2 mixer beside the attention in every layer ("hybrid" cache layers)
        config = FalconH1Config(
            vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, mamba_n_groups=1, mamba_n_heads=16, mamba_d_state=16, mamba_d_conv=4,
            mamba_expand=2, mamba_chunk_size=16, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    elif kind == "zamba":  # Mamba layers; every third also runs a shared attention block ("hybrid")
        config = ZambaConfig(
            vocab_size=99, hidden_size=32, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
            attention_head_dim=8, intermediate_size=37, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
            mamba_dt_rank=4, attn_layer_period=3, attn_layer_offset=1, n_mamba_heads=2, pad_token_id=0,
            eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    elif kind == "zamba2":  # Mamba-2 layers and hybrid layers with a shared attention block
        config = Zamba2Config(
            vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
            intermediate_size=37, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_headdim=8,
            n_mamba_heads=8, mamba_ngroups=1, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
            num_mem_blocks=1, use_shared_attention_adapter=False, chunk_size=16, pad_token_id=0, eos_token_id=1,
            bos_token_id=2,
        )  # fmt: skip
    elif kind in (
        "mamba",
        "falcon_mamba",
    ):  # pure state-space models: Mamba-1 mixers only, no attention layer
        config = (MambaConfig if kind == "mamba" else FalconMambaConfig)(
            vocab_size=99, hidden_size=32, num_hidden_layers=3, state_size=8, conv_kernel=4, expand=2,
            time_step_rank=4, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        )  # fmt: skip
    elif kind == "lfm2_moe":
        config = Lfm2MoeConfig(**sizes, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                               num_dense_layers=1)  # fmt: skip
    else:
        config = Lfm2Config(**sizes)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sharpen(model, 4.0)  # peaked outputs: drafts are accepted and rejected
    return model.eval()


def _noisy_draft_equals_plain(model: torch.nn.Module, num_draft_tokens: int):
    """Assert that 16 greedy tokens for a ragged batch of two random prompts (ids within the model's vocabulary),
    drafted by a noisy copy of ``model``, are plain ``generate``'s; return the call's speculation statistics."""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (2, 40), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    plain = model.generate(**common)
    out = model.generate(**common, custom_generate=hsv.generate, return_dict_in_generate=True,
                         speculation={"strategy": "draft_model", "num_draft_tokens": num_draft_tokens},
                         draft_model=noisy_copy(model))  # fmt: skip
    assert torch.equal(out.sequences, plain)
    return out.speculation


@pytest.mark.parametrize(
    "kind",
    [
        "lfm2",
        "lfm2_moe",
        "qwen3_next",
        "bamba",
        "jamba",
        "granitemoehybrid",
        "falcon_h1",
        "zamba",
        "zamba2",
        "mamba",
        "falcon_mamba",
    ],
)
@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model", "auto"])
def test_hybrid_equals_plain(kind, strategy):
    model = _hybrid(kind)
    strategy_equals_plain(model, strategy)


def test_linear_attention_state_after_a_partly_accepted_draft():
    """A noisy copy as draft model: drafts accepted part-way (mean acceptance between 1 and K + 1), and each next
    step finds the recurrent state after the last accepted token; the target as its own draft accepts everything."""
    model = _hybrid("qwen3_next")
    stats = equal_plain(
        model, {"strategy": "draft_model", "num_draft_tokens": 4}, draft_model=noisy_copy(model)
    )
    assert 1.2 < stats.mean_acceptance_length < 4.5
    stats = equal_plain(
        model, {"strategy": "draft_model", "num_draft_tokens": 4}, draft_model=_hybrid("qwen3_next")
    )
    assert stats.mean_acceptance_length > 4.0


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe", "olmo_hybrid", "lara_mini", "nemotron_h"])
def test_survey_hybrids_equal_plain(model_type):
    """The survey's tiny model of more hybrid families (Gated DeltaNet; Nemotron-H's Mamba-2, MoE and MLP blocks),
    with a noisy copy as draft model (drafts accepted part-way)."""
    stats = _noisy_draft_equals_plain(build(model_type)[0], num_draft_tokens=3)
    assert stats.mean_acceptance_length > 1.0


@pytest.mark.parametrize("kind", ["lfm2", "qwen3_next", "bamba"])
def test_prefill_chunks_read_the_inputs_before_them(monkeypatch, kind):
    """Chunks of 16 tokens per row (the prompt in three): each chunk's window starts with the inputs before it."""
    monkeypatch.setattr(runner_module, "PREFILL_TOKENS", 32)
    widths = []
    forward = runner_module.ModelRunner.run_model

    def counted(self, ids, step, logits_to_keep=0):
        if step.phase is Phase.PREFILL:
            widths.append(ids.shape[1])
        return forward(self, ids, step, logits_to_keep)

    monkeypatch.setattr(runner_module.ModelRunner, "run_model", counted)
    equal_plain(_hybrid(kind), {"strategy": "prompt_lookup", "num_draft_tokens": 4})
    assert widths[:3] == [8, 16, 16]


def test_self_speculation_is_refused_with_the_reason():
    ids, mask = copy_prompt()
    with pytest.raises(NotImplementedError, match="recurrent layers"):
        _hybrid().generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0,
                           custom_generate=hsv.generate, speculation={"strategy": "vegas"})  # fmt: skip


def test_hybrid_layers_keep_keys_beside_the_mixer_state():
    """Falcon-H1's ``hybrid`` cache layers are `SpecHybridLayer`s: keys and values in their own buffers, counted in
    the cache's bytes with the convolution inputs and states."""
    from hf_sparse_verify._compat import hybrid_layer_indices, recurrent_layer_indices
    from hf_sparse_verify.attention.cache import SpecHybridLayer

    model = _hybrid("falcon_h1")
    assert hybrid_layer_indices(model) == recurrent_layer_indices(model) == [0, 1, 2, 3]
    cache = SpecCache(4, 2, 16, recurrent_layers=[0, 1, 2, 3], hybrid_layers=[0, 1, 2, 3])
    layer = cache.layers[1]
    assert isinstance(layer, SpecHybridLayer) and layer.keys is None
    step = StepContext(Phase.PREFILL, torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long), q_len=3,
                       kv_len=3)  # fmt: skip
    with step_scope(step):
        keys, _ = cache.update(torch.ones(2, 2, 3, 8), torch.ones(2, 2, 3, 8), 1)
        layer.update_conv_state(torch.ones(2, 5, 3), conv_kernel_size=4)
    assert keys.shape == (2, 2, 16, 8) and keys[:, :, :3].eq(1).all() and keys[:, :, 3:].eq(0).all()
    assert cache.nbytes == 2 * keys.nbytes + layer.inputs.nbytes


def test_conv_window_reads_the_inputs_before_the_step_and_zeroes_padding():
    """Row 1 is padded to slot 2; a step of 3 tokens at slots 4-6 reads slots 2-6 (kernel 3): the two inputs before
    it, then its own; slots before the row's padding read as zeros."""
    cache = SpecCache(num_layers=1, batch_size=2, capacity=10, recurrent_layers=[0])
    layer = cache.layers[0]
    assert isinstance(layer, SpecConvLayer)
    pad = torch.tensor([0, 3])
    history = torch.arange(2 * 4 * 10, dtype=torch.float32).reshape(2, 4, 10)
    prefill = StepContext(
        Phase.PREFILL, torch.zeros(2, dtype=torch.long), pad, q_len=4, kv_len=4, backend="reference"
    )
    with step_scope(prefill):
        cache.update_conv_state(history[:, :, :4], 0, conv_kernel_size=3)
    step = StepContext(Phase.VERIFY, torch.tensor([4, 4]), pad, q_len=3, kv_len=7, backend="reference")
    new = -torch.ones(2, 4, 3)
    with step_scope(step):
        window = cache.update_conv_state(new, 0, conv_kernel_size=3)
    assert window.shape == (2, 4, 5)
    torch.testing.assert_close(window[0, :, :2], history[0, :, 2:4])
    torch.testing.assert_close(window[1, :, :2], torch.stack([torch.zeros(4), history[1, :, 3]], dim=1))
    torch.testing.assert_close(window[:, :, 2:], new)
    assert cache.get_conv_state(0) is None  # models take the window path at every step


def test_conv_inputs_live_in_a_ring_whatever_the_capacity():
    """The convolution inputs take ``RING + kernel - 1`` slots per row, not one per cache slot (a 16K cache of
    Qwen3-Next's 8,192 conv channels in 36 layers would otherwise hold 9.7 GB per row); a step past the ring's end
    reads the inputs before it across the wrap, and a prefill wider than the ring keeps its last inputs."""
    cache = SpecCache(num_layers=1, batch_size=1, capacity=100_000, recurrent_layers=[0])
    layer = cache.layers[0]
    slots = SpecConvLayer.RING + 2
    history = torch.arange(2 * 50, dtype=torch.float32).reshape(1, 2, 50)
    prefill = StepContext(Phase.PREFILL, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                          q_len=50, kv_len=50, backend="reference")  # fmt: skip
    with step_scope(prefill):
        window = cache.update_conv_state(history, 0, conv_kernel_size=3)
    assert layer.inputs.shape == (1, 2, slots)
    torch.testing.assert_close(window[:, :, 2:], history)  # the prefill convolves all of its own inputs
    step = StepContext(Phase.VERIFY, torch.tensor([50]), torch.zeros(1, dtype=torch.long), q_len=4, kv_len=54,
                       backend="reference")  # fmt: skip
    new = -torch.ones(1, 2, 4)
    with step_scope(step):
        window = cache.update_conv_state(new, 0, conv_kernel_size=3)
    torch.testing.assert_close(window[:, :, :2], history[:, :, 48:50])
    torch.testing.assert_close(window[:, :, 2:], new)


def _warmed_ring_cache(guard: bool) -> SpecCache:
    """A recurrent layer's rings after a 50-token prefill (inputs 0..99 over two channels; state 7 after slot 49),
    then what a graph capture's warm-up writes at the cache's last 5 slots (`engine.graphs`), under
    `SpecCache.keep_rings` or not. Capacity 85 makes those slots alias the live ring entries: slots 48 and 49 in the
    inputs' ring of 35, slot 49 in the states' ring of 32."""
    cache = SpecCache(num_layers=1, batch_size=1, capacity=85, recurrent_layers=[0])
    zero = torch.zeros(1, dtype=torch.long)
    with step_scope(StepContext(Phase.PREFILL, zero, zero, q_len=50, kv_len=50, backend="reference")):
        cache.update_conv_state(torch.arange(100.0).reshape(1, 2, 50), 0, conv_kernel_size=3)
        cache.update_recurrent_state(torch.full((1, 4), 7.0), 0)
    warm_up = StepContext(Phase.VERIFY, torch.tensor([80]), zero, q_len=5, kv_len=85, backend="reference")
    with cache.keep_rings(80, 5) if guard else contextlib.nullcontext():
        with step_scope(warm_up):
            cache.update_conv_state(-torch.ones(1, 2, 5), 0, conv_kernel_size=3)
        for i in range(5):  # token by token, as `TokenByToken` keeps each token's state
            with step_scope(warm_up.token(i)):
                cache.update_recurrent_state(torch.full((1, 4), -1.0), 0)
    return cache


@pytest.mark.parametrize("guard", [True, False])
def test_graph_warm_up_leaves_the_rings_as_they_were(guard):
    """Capturing a step's graph runs it first at the cache's last slots; in the rings those slots alias live entries,
    which `SpecCache.keep_rings` puts back (on the GPU, Bamba, Granite 4, Nemotron-H and OLMo-Hybrid lost their
    history this way; without the guard the same writes are seen to corrupt it here)."""
    cache = _warmed_ring_cache(guard)
    zero = torch.zeros(1, dtype=torch.long)
    with step_scope(StepContext(Phase.VERIFY, torch.tensor([50]), zero, q_len=1, kv_len=51, backend="reference")):
        window = cache.update_conv_state(torch.zeros(1, 2, 1), 0, conv_kernel_size=3)
        state = cache.get_recurrent_state(0)
    intact = torch.equal(window[0, :, :2], torch.tensor([[48.0, 49.0], [98.0, 99.0]])) and bool((state == 7).all())
    assert intact == guard


def test_gated_delta_one_token_steps_take_the_window_kernel(monkeypatch):
    """Where the window kernel runs, K = 0 steps (one token) go through it too, reading and writing the ring in
    place, and greedy output still equals plain ``generate``."""
    from hf_sparse_verify.integrations import recurrent
    from hf_sparse_verify.kernels._triton import triton_runs_on

    if not triton_runs_on(torch.device("cpu")):
        pytest.skip("the window kernel runs on this CPU only under TRITON_INTERPRET=1")
    widths, kernel = [], recurrent.gated_delta_ring
    monkeypatch.setattr(recurrent, "gated_delta_ring", lambda q, *a: widths.append(q.shape[1]) or kernel(q, *a))
    monkeypatch.setattr(recurrent, "compiled_on", lambda device: True)  # the kernel path is the GPU's
    equal_plain(_hybrid("qwen3_next"), {"strategy": "prompt_lookup", "k_policy": "plain"})
    assert widths and set(widths) == {1}


def test_linear_attention_sampling_follows_the_target_distribution():
    """Sampling with a noisy draft model on Qwen3-Next: the pairs (t1, t2) and (t2, t3) of many identical prompts
    follow the target's exact joint distribution, t3 often drawn right after a draft was rejected at t2 (the
    recurrent state after the accepted tokens only)."""
    from test_verify import E2E_VOCAB, _joint_next_tokens, _joint_pvalue

    prompt = [3, 5, 2, 7, 1, 4, 6, 2, 5, 3, 7, 1]  # longer than the convolution: the state carries the start

    rows = 2000

    config = Qwen3NextConfig(
        vocab_size=E2E_VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    sharpen(model, 4.0)  # peaked outputs: drafts are accepted and rejected
    draft = noisy_copy(model, scale=1.5)
    target_12, target_23 = _joint_next_tokens(model, prompt)
    torch.manual_seed(0)
    out = model.generate(
        input_ids=torch.tensor([prompt]).repeat(rows, 1), max_new_tokens=3, do_sample=True,
        custom_generate=hsv.generate, speculation={"strategy": "draft_model", "num_draft_tokens": 2},
        draft_model=draft, return_dict_in_generate=True,
    )  # fmt: skip
    new = out.sequences[:, len(prompt) :]
    rejected_first = sum(a == 0 for a in out.speculation.accepted_tokens[0])
    assert rejected_first > 100  # many rows drew t2 at a rejection, then t3 in the next step
    assert _joint_pvalue(new[:, 0], new[:, 1], target_12) > 1e-3
    assert _joint_pvalue(new[:, 1], new[:, 2], target_23) > 1e-3


@pytest.mark.parametrize("kind", ["qwen3_next", "jamba"])
def test_hybrid_equals_plain_on_the_triton_backend(kind):
    """The attention layers on the Triton backend (its kernels run interpreted off a GPU), a noisy draft model."""
    model = _hybrid(kind)
    speculation = {
        "strategy": "draft_model",
        "num_draft_tokens": 4,
        "attention_backend": "triton",
        "cuda_graphs": False,
    }
    stats = equal_plain(model, speculation, draft_model=noisy_copy(model))
    assert stats.mean_acceptance_length > 1.0


def test_only_mlp_and_moe_blocks_pass_as_cacheless_layers():
    """A ``dummy`` cache layer passes when the config names it an MLP or MoE block (Nemotron-H), not when it reuses
    another layer's KV (Gemma 4's shared layers, which transformers also maps to ``dummy``)."""
    from types import SimpleNamespace

    from hf_sparse_verify._compat import _cacheless

    blocks = SimpleNamespace(layer_types=["linear_attention", "moe", "full_attention", "mlp"])
    assert _cacheless(blocks, ["linear_attention", "dummy", "full_attention", "dummy"]) == {"dummy"}
    shared = SimpleNamespace(layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert _cacheless(shared, ["sliding_attention", "full_attention", "dummy"]) == frozenset()


@pytest.mark.parametrize(
    "model_type, kernel",
    [("qwen3_next", True), ("qwen3_next", False), ("qwen3_5", False), ("lara_mini", False), ("olmo_hybrid", True),
     ("olmo_hybrid", False)],
)  # fmt: skip
def test_gated_delta_verify_runs_the_layer_once_per_step(monkeypatch, model_type, kernel):
    """Gated DeltaNet layers of known layouts run verify steps through `GatedDeltaWindow` (projections, convolution
    and output once per step; the recurrence in one window kernel where Triton runs, else the layer's own rule per
    token) and greedy output still equals plain ``generate`` with drafts rejected part-way; their layers are called
    whole only for prefill and one-token steps."""
    from hf_sparse_verify.integrations import recurrent
    from hf_sparse_verify.kernels._triton import triton_runs_on

    if kernel and not triton_runs_on(torch.device("cpu")):
        pytest.skip("the window kernel runs on this CPU only under TRITON_INTERPRET=1")
    widths, whole, launches = [], [], []
    window_forward, window_kernel = recurrent.GatedDeltaWindow.forward, recurrent.gated_delta_ring

    def spy(self, hidden_states, *args, **kwargs):
        widths.append(hidden_states.shape[1])
        return window_forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(recurrent.GatedDeltaWindow, "forward", spy)
    monkeypatch.setattr(recurrent, "gated_delta_ring", lambda *a: launches.append(1) or window_kernel(*a))
    monkeypatch.setattr(recurrent, "compiled_on", lambda device: kernel)  # the kernel path is the GPU's
    monkeypatch.setattr(recurrent.TokenByToken, "forward", lambda *a, **k: whole.append(1))  # must not run
    model = _hybrid("qwen3_next") if model_type == "qwen3_next" else build(model_type)[0]
    stats = _noisy_draft_equals_plain(model, num_draft_tokens=4)
    assert 1.0 < stats.mean_acceptance_length < 5.0
    assert 5 in widths and not whole  # verify steps of K + 1 tokens went through the window
    assert bool(launches) == kernel
