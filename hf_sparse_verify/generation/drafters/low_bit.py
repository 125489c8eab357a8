"""A low-bit copy of a target to draft with (issue 39, QuantSpec's idea): the target's own architecture and weights,
its linear layers rounded through int8 or int4 (`hf_sparse_verify.kernels.low_bit`), drafting with its own full KV
cache as a draft model does. Verification runs the target's own weights, so greedy output equals plain `generate`
and sampling keeps the target's distribution whatever the rounding does to acceptance.

What this is today: a **reference** draft for measuring acceptance (``benchmarks/bench_low_bit_acceptance.py``).
Its weights are rounded but stored in the model's dtype (a full second copy of the model), so it reads as many
bytes per step as the target: it does not make drafting cheaper until the weight-only low-bit matmul kernel and
the in-place draft path (one model, two weight sets, no second KV cache) exist.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    ...                      num_attention_heads=2, num_key_value_heads=1)
    >>> target = LlamaForCausalLM(config)
    >>> draft = low_bit_copy(target, "int4", group_size=32)
    >>> draft.config.low_bit_draft, draft is target
    ('int4', False)
"""

from __future__ import annotations

import copy

import torch

from ...kernels.low_bit import LOW_BIT_FORMATS, fake_quantize, quantized_bytes


def low_bit_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The linear layers a low-bit draft rounds: every ``nn.Linear`` except the output embeddings (kept, as the
    input embeddings are: the vocabulary projection is a small share of a large model's bytes and the draft's
    token choice rests on it)."""
    head = model.get_output_embeddings()
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    ]


def low_bit_copy(model: torch.nn.Module, weights: str, group_size: int = 128) -> torch.nn.Module:
    """A copy of ``model`` whose linear layers (`low_bit_linears`) hold their weights rounded through ``weights``
    (``"int8"`` per output channel, ``"int4"`` per group of ``group_size`` input channels); ``model`` is left as is.
    The copy's ``config.low_bit_draft`` names the format; use it as ``draft_model`` of the ``draft_model``
    strategy."""
    if weights not in LOW_BIT_FORMATS:
        raise ValueError(f"weights must be one of {sorted(LOW_BIT_FORMATS)}, got {weights!r}")
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for _, linear in low_bit_linears(draft):
            linear.weight.copy_(fake_quantize(linear.weight, weights, group_size))
    draft.config.low_bit_draft = weights
    return draft


def low_bit_bytes(model: torch.nn.Module, weights: str, group_size: int = 128) -> dict:
    """Bytes of the rounded linear layers once packed in ``weights`` against the same layers in the model's dtype
    (``{"low_bit": ..., "original": ...}``): what the draft would read per step with a low-bit kernel."""
    linears = low_bit_linears(model)
    return {
        "low_bit": sum(quantized_bytes(m.weight, weights, group_size) for _, m in linears),
        "original": sum(m.weight.nbytes for _, m in linears),
    }
