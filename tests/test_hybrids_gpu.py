"""The models of issue 41 on the GPU fast path (Triton attention backend, compiled kernels, CUDA graphs), float32,
random weights at the survey's small sizes (`arch_survey.build`): greedy output equal to plain ``generate`` with
prompt lookup and with a noisy copy as draft model (drafts accepted part-way, so rejected drafts roll back). Gated
DeltaNet layers (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid) run their recurrence through the ring kernel
(`kernels.gated_delta`) here, as they do only on a GPU; Mamba mixers, short convolutions, KV-shared layers
(Gemma 3n, Gemma 4), DSA indexers (DeepSeek-V3.2, GLM-MoE-DSA) and ALiBi (BLOOM, MPT) inside captured steps.
Skipped without a CUDA GPU."""

from __future__ import annotations

import pytest
import torch
from arch_survey import build
from conftest import noisy_copy

import hf_sparse_verify as hsv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODEL_TYPES = [
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "olmo_hybrid",
    "lfm2",
    "jamba",
    "bamba",
    "falcon_h1",
    "granitemoehybrid",
    "nemotron_h",
    "gemma3n_text",  # the text model: gemma3n's vision tower needs timm, and where timm is installed it is large
    "gemma4",
    "deepseek_v32",
    "glm_moe_dsa",
    "bloom",
    "mpt",
]
MAX_NEW = 16


def _prompts(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 40 tokens whose last 12 repeat the 12 before them (text prompt lookup finds), row 1 left-padded
    by 9."""
    ids = torch.randint(3, vocab, (2, 40), generator=torch.Generator().manual_seed(0))
    ids[:, -12:] = ids[:, -24:-12]
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    return ids, mask


@pytest.mark.parametrize("strategy", ["prompt_lookup", "draft_model"])
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fast_path_equals_plain_generate(model_type, strategy):
    model = build(model_type)[0]
    extra = {}
    if strategy == "draft_model":
        extra["draft_model"] = noisy_copy(model).cuda()  # the noise is drawn on the CPU
    model = model.cuda()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids, mask = (t.cuda() for t in _prompts(vocab))
    common = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=0)
    speculation = dict(attention_backend="triton", cuda_graphs=True, strategy=strategy, num_draft_tokens=4)
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(
            **common, custom_generate=hsv.generate, speculation=speculation, return_dict_in_generate=True, **extra
        )
    assert torch.equal(out.sequences, expected)
    if strategy == "draft_model":
        assert out.speculation.mean_acceptance_length > 1.0
