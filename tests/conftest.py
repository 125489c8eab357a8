"""Shared fixtures: tiny random models of every supported architecture (float32, fixed seeds), a character
tokenizer matching their vocabulary, and the trained fixtures of ../shared/models when present."""

from __future__ import annotations

import contextlib
import copy
import os

# Triton kernels run in the CPU interpreter where there is no GPU; set before anything imports triton.
if not os.path.exists("/dev/nvidia0") and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers import models as hf_models

import hf_sparse_verify as hsv
from hf_sparse_verify.integrations import Mode, speculation_mode

VOCAB = 96
PAD, EOS, BOS = 0, 1, 2
SHARED_MODELS = (
    Path(os.environ.get("HF_SPARSE_VERIFY_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "models"
)

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    pad_token_id=PAD,
    eos_token_id=EOS,
    bos_token_id=BOS,
    tie_word_embeddings=False,
)

#: architecture name -> (config class, extra config fields)
ARCHITECTURES: dict[str, tuple[type, dict]] = {
    "llama": (hf_models.llama.LlamaConfig, {}),
    "qwen2": (hf_models.qwen2.Qwen2Config, {}),
    "qwen3": (hf_models.qwen3.Qwen3Config, {"head_dim": 16}),
    # a window shorter than the sequences, so the sliding mask really matters
    "mistral": (hf_models.mistral.MistralConfig, {"sliding_window": 9, "head_dim": 16}),
    "qwen3_moe": (
        hf_models.qwen3_moe.Qwen3MoeConfig,
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16},
    ),
    "mixtral": (hf_models.mixtral.MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "olmoe": (hf_models.olmoe.OlmoeConfig, {"num_experts": 4, "num_experts_per_tok": 2}),
}


@contextlib.contextmanager
def decoding_experts(*models: torch.nn.Module, use_fused: bool | None = None, expert_skipping: bool = False):
    """The experts implementation of decoding steps for ``models``, through the library's one switch (no attention
    change): what the loop runs after the prefill."""
    mode = Mode(attention=False, fused_experts=use_fused, expert_skipping=expert_skipping)
    with speculation_mode(*models, mode=mode) as switched, switched.decoding_experts():
        yield switched


def pytest_configure(config) -> None:
    """Under pytest-xdist each worker takes its share of the CPU threads: N workers each starting torch's default
    (one thread per core) oversubscribe the cores; measured on one H100 machine (16 cores, 16 workers), the whole
    suite took 249 s this way and did not finish in 535 s without it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def make_model(arch: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny float32 random model of ``arch`` in eval mode."""
    config_cls, extra = ARCHITECTURES[arch]
    config = config_cls(**{**_COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # larger weights than the default init give peaked, repetitive outputs (like trained models), so n-gram and
    # draft-model acceptance is exercised
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "norm" not in name:
                p.mul_(4.0)
    return model.eval()


def noisy_copy(model: torch.nn.Module, scale: float = 0.15, seed: int = 1) -> torch.nn.Module:
    """A draft that agrees with ``model`` most of the time but not always."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            spread = p.std() if p.numel() > 1 else p.abs().mean()
            p.add_(torch.randn(p.shape, generator=gen) * scale * spread.clamp_min(1e-3))
    return draft.eval()


def sharpen(model: torch.nn.Module, factor: float, skip: tuple[str, ...] = ("norm",)) -> torch.nn.Module:
    """Scale ``model``'s matrices (not those whose name holds one of ``skip``) by ``factor``: peaked outputs, as
    trained models have, so drafts are both accepted and rejected."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and not any(part in name for part in skip):
                p.mul_(factor)
    return model


def copy_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 40 tokens (vocabulary 3-98) whose last 12 repeat the 12 before them (text worth looking up),
    row 1 left-padded by 9."""
    ids = torch.randint(3, 99, (2, 40), generator=torch.Generator().manual_seed(0))
    ids[:, -12:] = ids[:, -24:-12]
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    return ids, mask


def equal_plain(model: torch.nn.Module, speculation: dict, **extra):
    """Assert that 24 greedy tokens on `copy_prompt` with ``speculation`` are plain ``generate``'s; return the
    call's speculation statistics."""
    ids, mask = copy_prompt()
    common = dict(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
    plain = model.generate(**common)
    out = model.generate(**common, custom_generate=hsv.generate, speculation=speculation,
                         return_dict_in_generate=True, **extra)  # fmt: skip
    assert torch.equal(out.sequences, plain)
    return out.speculation


def strategy_equals_plain(model: torch.nn.Module, strategy: str):
    """`equal_plain` for one lossless ``strategy`` (K = 4; ``auto`` as it chooses); ``draft_model`` drafts with a
    `noisy_copy`, whose drafts must be accepted part-way (so rejection and rollback ran). Returns the statistics."""
    extra = {"draft_model": noisy_copy(model)} if strategy == "draft_model" else {}
    speculation = {"strategy": "auto"} if strategy == "auto" else {"strategy": strategy, "num_draft_tokens": 4}
    stats = equal_plain(model, speculation, **extra)
    if strategy == "draft_model":
        assert 1.0 < stats.mean_acceptance_length < 5.0
    return stats


def ragged_batch(batch: int, length: int = 14, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of different lengths, ``[B, length]`` ids and mask."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(batch):
        pad = (row * 5) % (length - 3)
        mask[row, :pad] = 0
    ids[mask == 0] = PAD
    return ids, mask


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer whose VOCAB tokens are single characters (ids 0-2 special), for stop strings and pipelines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS}
    for i in range(3, VOCAB):
        vocab[chr(ord("!") + i - 3)] = i
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    tok.padding_side = "left"
    return tok


@pytest.fixture(scope="session")
def shared_models() -> Path:
    if not (SHARED_MODELS / "code-target").is_dir():
        pytest.skip(
            f"trained fixtures not found at {SHARED_MODELS} (../shared/models); skipping fixture tests"
        )
    return SHARED_MODELS


@pytest.fixture
def launches(monkeypatch):
    """Token counts of the fused kernel's launches (so a test fails if the model silently ran something else)."""
    from hf_sparse_verify.kernels.fused_experts import kernel as kernel_module

    calls, launch = [], kernel_module.launch

    def spy(hidden, *args, **kwargs):
        calls.append(hidden.shape[0])
        return launch(hidden, *args, **kwargs)

    monkeypatch.setattr(kernel_module, "launch", spy)
    return calls


@pytest.fixture
def attended(monkeypatch):
    """Class names of the modules the "reference" and "triton" attention backends were called with."""
    from hf_sparse_verify.attention import BACKENDS

    seen = []

    def spy(backend):
        def run(module, *args, **kwargs):
            seen.append(type(module).__name__)
            return backend(module, *args, **kwargs)

        return run

    for name in ("reference", "triton"):
        monkeypatch.setitem(BACKENDS, name, spy(BACKENDS[name]))
    return seen
