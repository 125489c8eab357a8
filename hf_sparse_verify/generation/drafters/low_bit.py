"""A low-bit copy of a target to draft with (issue 39, QuantSpec's idea): the target's own architecture and weights,
its linear layers stored in int8 or int4 (`hf_sparse_verify.kernels.low_bit`) and run by the weight-only low-bit
matmul (`LowBitLinear`), drafting with its own full KV cache as a draft model does. Verification runs the target's
own weights, so greedy output equals plain `generate` and sampling keeps the target's distribution whatever the
rounding does to acceptance.

The copy shares every weight that is not a rounded linear layer with the target (embeddings, head, norms, routers,
MoE experts: the same tensors, no second copy); its own memory is the packed weights and scales
(`draft_weight_bytes`). It keeps a KV cache of its own (the ``draft_model`` strategy), so it suits short and medium
prompts; a draft that shares the target's cache (one model, two weight sets) is not built yet. The ``low_bit``
strategy (`LowBitDrafter`) makes the copy once per target and format and drafts with it.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
    ...                      num_attention_heads=2, num_key_value_heads=1)
    >>> target = LlamaForCausalLM(config)
    >>> draft = low_bit_copy(target, "int4", group_size=32)
    >>> draft.config.low_bit_draft, type(draft.model.layers[0].mlp.down_proj).__name__
    ('int4', 'LowBitLinear')
    >>> up = draft.model.layers[0].mlp.up_proj  # gate and up are one stacked layer, q / k / v another
    >>> type(up).__name__, up.whole is draft.model.layers[0].mlp.gate_proj.whole
    ('LowBitRows', True)
    >>> draft.model.embed_tokens.weight is target.model.embed_tokens.weight
    True
"""

from __future__ import annotations

import copy
import weakref

import torch

from ...integrations import mlp, qkv_attention
from ...integrations.low_bit_linear import LowBitLinear, LowBitRows
from ...kernels.low_bit import LOW_BIT_FORMATS, quantized_bytes
from .draft_model import DraftModelDrafter

__all__ = [
    "LowBitDrafter",
    "LowBitLinear",
    "LowBitRows",
    "default_group",
    "draft_weight_bytes",
    "low_bit_bytes",
    "low_bit_copy",
    "low_bit_draft_for",
    "low_bit_linears",
]


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


def stacks(module: torch.nn.Module) -> list[tuple[str, ...]]:
    """The projections of ``module`` that a low-bit copy stacks into one layer (`LowBitLinear.stack`): those a
    replacement module runs together, in one launch (`FusedQKVAttention`: q / k / v of the Llama-family attention
    classes; `LowBitGatedMLP`: gate / up of a bias-free SiLU gated MLP). Measured at one row on an H100 (8B shape,
    weights out of L2, ``results/low_bit_linear_cold.json``): tinygemm reads a 4096-channel q at 0.45 of the copy
    bandwidth, a 1024-channel k or v at 0.17 and a 14336-channel gate at 0.60."""
    out = []
    if qkv_attention.replaceable_attention(module):
        out.append(("q_proj", "k_proj", "v_proj"))
    if mlp.replaceable_mlp(module):
        out.append(("gate_proj", "up_proj"))
    return out


def low_bit_copy(
    model: torch.nn.Module,
    weights: str,
    group_size: int = 128,
    layout: str = "auto",
    stack: bool = True,
    rounding: str = "mse",
) -> torch.nn.Module:
    """A copy of ``model`` whose linear layers (`low_bit_linears`) are `LowBitLinear`s in ``weights`` (``"int8"``
    per output channel, ``"int4"`` per group of ``group_size`` input channels; ``layout`` as `LowBitLinear`'s:
    int4 bf16 layers on CUDA run PyTorch's tinygemm by default); every other weight is shared with ``model`` (not
    copied), and ``model`` is left as is. With ``stack`` (default) the projections our replacement modules run
    together (`stacks`: q / k / v, gate / up) are `LowBitRows` of one stacked layer each: the same weights, one
    launch in those modules. ``rounding``: how the scales are picked (`LowBitLinear`). The copy's
    ``config.low_bit_draft`` names the format; use it as ``draft_model`` of the ``draft_model`` strategy."""
    if weights not in LOW_BIT_FORMATS:
        raise ValueError(f"weights must be one of {sorted(LOW_BIT_FORMATS)}, got {weights!r}")
    linears = low_bit_linears(model)
    rounded = {
        id(linear): LowBitLinear(linear, weights, group_size, layout, rounding) for _, linear in linears
    }
    for module in model.modules() if stack else ():
        for names in stacks(module):
            parts = [getattr(module, name, None) for name in names]
            if not all(id(p) in rounded for p in parts):
                continue
            try:
                whole = LowBitLinear.stack([rounded[id(p)] for p in parts])
            except ValueError:  # e.g. one of them in another layout: they stay apart
                continue
            start = 0
            for p in parts:
                rounded[id(p)] = LowBitRows(whole, start, start + p.out_features)
                start += p.out_features
    # deepcopy's memo stands in for the objects it would copy: each rounded Linear is its low-bit layer, every other
    # parameter the original itself
    memo: dict[int, object] = {id(p): p for p in model.parameters()}
    memo.update(rounded)
    draft = copy.deepcopy(model, memo)  # its config is a copy too
    draft.config.low_bit_draft = weights
    return draft.eval()


def draft_weight_bytes(draft: torch.nn.Module) -> int:
    """Bytes a low-bit copy holds of its own (packed weights and scales; the rest is shared with its target)."""
    return sum(m.stored.nbytes + m.scales.nbytes for m in draft.modules() if isinstance(m, LowBitLinear))


#: what ``draft_weights="auto"`` tries, fewest bytes first
AUTO_FORMATS = ("int4", "int8")


def draft_weights_for(model: torch.nn.Module, weights: str | None, group_size: int | None, rows: int) -> str | None:
    """``SpeculationConfig.draft_weights`` as a call of ``rows`` rows runs it: ``"auto"`` becomes the first of
    `AUTO_FORMATS` whose copy's matmul is measured faster than bf16 at that many rows (`LowBitLinear.FASTER_ROWS`,
    for the layout the copy would take on ``model``'s device and dtype), else None: the model's own weights (also
    for a model spread over several devices, where no copy drafts). Any other value is returned as given."""
    if weights != "auto":
        return weights
    if len({p.device for p in model.parameters()}) > 1:
        return None
    linears = [linear for _, linear in low_bit_linears(model)]
    for fmt in AUTO_FORMATS:
        group = 128
        if fmt == "int4":
            try:
                group = group_size or default_group(model)
            except ValueError:  # no int4 group divides the layers
                continue
            if any(m.in_features % group for m in linears):  # an explicit group that does not divide them
                continue
        if min(LowBitLinear.FASTER_ROWS[(fmt, LowBitLinear.layout_for(m, fmt, group))] for m in linears) >= rows:
            return fmt
    return None


def low_bit_bytes(model: torch.nn.Module, weights: str, group_size: int = 128) -> dict:
    """Bytes of the rounded linear layers once packed in ``weights`` (bf16 scales) against the same layers in the
    model's dtype (``{"low_bit": ..., "original": ...}``): what the draft reads per step in place of the target's."""
    linears = low_bit_linears(model)
    return {
        "low_bit": sum(quantized_bytes(m.weight, weights, group_size) for _, m in linears),
        "original": sum(m.weight.nbytes for _, m in linears),
    }


#: target -> {(format, group): its low-bit copy}: made once, kept while the target lives
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: int4 group sizes tried, largest first, where `SpeculationConfig.draft_weight_group` is None
GROUPS = (128, 64, 32)


def default_group(model: torch.nn.Module) -> int:
    """The largest of `GROUPS` that divides every rounded linear layer's input size."""
    sizes = {m.in_features for _, m in low_bit_linears(model)}
    for group in GROUPS:
        if all(size % group == 0 for size in sizes):
            return group
    raise ValueError(
        f"no int4 group of {list(GROUPS)} divides the linear layers' input sizes {sorted(sizes)}: set "
        "SpeculationConfig.draft_weight_group to one that does, or draft_weights='int8'"
    )


def low_bit_draft_for(target: torch.nn.Module, weights: str, group_size: int | None) -> torch.nn.Module:
    """The low-bit copy of ``target`` in ``weights`` with groups of ``group_size`` (None: `default_group`;
    `low_bit_copy`), made on the first request and kept while ``target`` lives; errors name the
    `SpeculationConfig` setting to change."""
    if group_size is None:
        group_size = default_group(target) if weights == "int4" else 128
    key = (weights, group_size)
    copies = _COPIES.setdefault(target, {})
    if key not in copies:
        try:
            copies[key] = low_bit_copy(target, weights, group_size)
        except ValueError as err:
            raise ValueError(f"low-bit draft weights: {err} (SpeculationConfig.draft_weight_group)") from None
    return copies[key]


class LowBitDrafter(DraftModelDrafter):
    """Strategy ``low_bit``: the ``draft_model`` strategy with the target's low-bit copy (`low_bit_draft_for`, in
    ``SpeculationConfig.draft_weights``, int4 by default, with groups of ``draft_weight_group``) as the draft model,
    drafting with a KV cache of its own."""

    takes_draft_model = False
    drafts_on_a_copy = True

    @property
    def low_bit_weights(self) -> str | None:
        return self.model.config.low_bit_draft

    @classmethod
    def from_config(cls, config, target, draft_model=None) -> LowBitDrafter:
        draft = low_bit_draft_for(target, config.draft_weights or "int4", config.draft_weight_group)
        target_vocab = target.get_output_embeddings().weight.shape[0]
        return cls(draft, target_vocab, config.max_draft_tokens)
