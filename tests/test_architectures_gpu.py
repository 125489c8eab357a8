"""A dozen popular architectures on the GPU fast path (triton backend + CUDA graphs), float32, random weights:
greedy output equal to plain ``generate`` with prompt_lookup and vegas. Soft-capped (gemma3, cohere2) and sink
(gpt_oss) layers run the decode-attention kernel with their logit modifications in decode and verify steps (the
reference attention in prefill and draft steps); MLA head sizes (deepseek_v3) run the reference attention inside
the captured steps; Falcon's attention modules are replaced for the call by ones that dispatch through
AttentionInterface. Skipped without a CUDA GPU."""

from __future__ import annotations

import pytest
import torch
from arch_survey import PAD, build_model, prompts

import hf_sparse_verify as hsv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: registry model type of each popular shape (falcon: the rotary multi-query Falcon-7B shape)
SHAPES = [
    "gemma3_text",
    "phi3",
    "gpt_oss",
    "deepseek_v3",
    "qwen2_moe",
    "granite",
    "olmo2",
    "starcoder2",
    "glm4",
    "cohere2",
    "smollm3",
    "falcon",
]
STRATEGIES = {
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
}
MAX_NEW = 24


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("model_type", SHAPES)
def test_fast_path_equals_plain_generate(model_type, strategy):
    model = build_model(model_type).cuda()
    ids, mask = (t.cuda() for t in prompts())
    common = dict(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD
    )
    speculation = dict(attention_backend="triton", cuda_graphs=True, **STRATEGIES[strategy])
    with torch.no_grad():
        expected = model.generate(**common)
        out = model.generate(**common, custom_generate=hsv.generate, speculation=speculation)
    assert torch.equal(out, expected)
