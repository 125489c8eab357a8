"""`speculation_mode`: the one switch that puts models into hf_sparse_verify's mode for a call, logs what it
changed, and puts everything back on exit (also on errors).

Everything a call changes on a transformers model goes through here (huggingface/kernels' ``kernelize`` is the
model): the attention implementation (``"sparse_verify"``, through ``set_attn_implementation``), SDPA's allowed
backends, module replacements (one walk of each model's module tree against `RULES`), and the experts
implementation of decoding steps (`Switched.decoding_experts`, entered by the loop after the prefill, because
transformers' own loop also runs the prefill on ``grouped_mm`` and the steps on a decoding implementation).

A replacement is stateless beyond what it shares with the original module and declares what it reads; nothing of
transformers is rebound or copied. Adding a replacement is one `Rule` line in `RULES` plus its module.

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...     num_attention_heads=2, vocab_size=50))
    >>> with speculation_mode(model, mode=Mode(attention=False, sparse_ffn=True)) as switched:
    ...     print(switched.counts, type(model.model.layers[0].mlp).__name__)
    {'GatedMLP': 2} GatedMLP
    >>> type(model.model.layers[0].mlp).__name__
    'LlamaMLP'
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from accelerate.hooks import remove_hook_from_module
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _compat
from ..attention.interface import NAME as ATTENTION_NAME
from ..attention.interface import register as register_attention
from ..kernels._triton import compiled_on
from ..placement import device_segments, dtensor_weights, spans_gpus, swappable
from ..placement import tensor_parallel as sharded
from . import (
    bloom,
    codegen,
    decoder_layer,
    experts,
    falcon,
    gpt_neo,
    gpt_neox_japanese,
    gptj,
    mla,
    mlp,
    mpt,
    qkv_attention,
    recurrent,
    rms_norm,
    router,
    segments,
    tensor_parallel,
    xglm,
)

logger = logging.getLogger(__name__)

Swap = tuple[torch.nn.Module, str, torch.nn.Module, torch.nn.Module]  # parent, name, original, replacement

#: SDPA backends our attention may use. cuDNN is left out: it builds an execution plan for every new shape, and
#: decode shapes change at every step (KV length, K + 1). Measured on an H200 (torch 2.11, code-target): with cuDNN
#: allowed, a generate call whose K varies spent 0.6 s of host time in 400 SDPA calls (1.5 ms each) against
#: 0.07 s without it.
SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)

#: the fused module kinds `Mode.fused_parts` may name
FUSED_PARTS = frozenset({"decoder_layer", "attention", "norm", "mlp", "router"})


@dataclass(frozen=True)
class Mode:
    """What `speculation_mode` switches on.

    Attributes:
        attention: the ``"sparse_verify"`` attention (needs a running step, `hf_sparse_verify.step.step_scope`),
            with attention modules that bypass `AttentionInterface` (Falcon's, GPT-J's, CodeGen's, GPT-Neo's)
            replaced by ones that dispatch through it. Off: modules only (kernel tests, calibration statistics).
        dispatch_attention: those dispatching replacements alone; None: with ``attention``. (``attention=False,
            dispatch_attention=True`` runs them under the model's own attention implementation, e.g. SDPA.)
        fused: the fused-kernel modules where their kernels run (CUDA with Triton): decoder layers, Llama-family
            q/k/v + rotary attention, RMSNorms, gated MLPs, MoE routers. They compute what the originals compute.
        fused_parts: which of those (`FUSED_PARTS` names); all by default.
        sparse_ffn: gated MLPs become `GatedMLP` on every device (lossy sparse FFN on verify steps).
        down_copy: `GatedMLP`'s transposed ``down_proj`` copy for the sparse kernel (see `mlp`).
        expert_skipping: decoding experts on ``"hsv_fused"`` everywhere (lossy expert skipping).
        fused_experts: decoding experts on ``"hsv_fused"``: None = on CUDA with Triton (`experts.FUSED_BY_DEFAULT`).
        device_segments: on a model whose weights are on several GPUs (an accelerate device map), every decoder
            layer becomes a `SegmentLayer`, so steps can run as one CUDA graph per device segment (transparent in
            eager steps).
        local_shards: a tensor-parallel model runs on its local shards with explicit collectives
            (`tensor_parallel.local_shard_swaps`) where they cover its sharded modules; the module replacements
            above then apply to it as to a model on one GPU.
    """

    attention: bool = True
    dispatch_attention: bool | None = None
    fused: bool = False
    fused_parts: frozenset[str] = FUSED_PARTS
    sparse_ffn: bool = False
    down_copy: bool = True
    expert_skipping: bool = False
    fused_experts: bool | None = None
    device_segments: bool = False
    local_shards: bool = True

    def __post_init__(self):
        unknown = set(self.fused_parts) - FUSED_PARTS
        if unknown:
            raise ValueError(f"unknown fused_parts {sorted(unknown)}; choose from {sorted(FUSED_PARTS)}")


@dataclass(frozen=True)
class Rule:
    """One module replacement: ``build(module, walk)`` returns the replacement for ``module`` or None.

    ``descend``: the walk goes on inside the replacement (it shares the original's children, as
    `decoder_layer.FusedDecoderLayer` does); ``wraps``: the replacement calls the original, which it keeps (as
    `recurrent.GatedDeltaWindow` does), and the walk goes on inside the original; otherwise the replacement stands
    for the whole subtree.
    """

    name: str
    build: Callable[[torch.nn.Module, _Walk], torch.nn.Module | None]
    descend: bool = False
    wraps: bool = False


@dataclass
class _Walk:
    """What a rule may read while the tree is walked: the mode, the model's text config and the decoder layer
    the walk is inside (MLPs learn their layer index from it)."""

    mode: Mode
    config: object | None
    layer_index: dict[int, int]
    layer: int | None = None
    segmented: bool = False  # the model's decoder layers run per device segment (`Mode.device_segments`)
    wrapped: set = field(
        default_factory=set
    )  # ids of the layers wrapped (the walk goes on inside the wrapper)
    one_device: frozenset = frozenset()  # decoder layers whose weights are all on one device
    first_device: torch.device | None = None  # where a segmented model's forward starts (its input embedding)

    def in_one_device_layer(self) -> bool:
        """Inside a decoder layer on one device: its own accelerate hook has moved its inputs there, so hooks below
        it that only move inputs to that device may be dropped (`hf_sparse_verify.placement.swappable`)."""
        return self.layer is not None and self.layer in self.one_device

    def fused(self, part: str) -> bool:
        return self.mode.fused and part in self.mode.fused_parts


def _device_segment(module, walk: _Walk):
    index = walk.layer_index.get(id(module))
    if walk.segmented and index is not None and id(module) not in walk.wrapped:
        walk.wrapped.add(id(module))
        return segments.SegmentLayer(module, index)
    return None


def _token_by_token(module, walk: _Walk):
    """Linear-attention layers of hybrid models run their recurrence one token at a time in verify steps: not an
    optimisation, what keeps their recurrent state exact after rejected drafts. Gated DeltaNet layers of known
    layouts run the rest of the layer once per step (`recurrent.GatedDeltaWindow`), the others whole per token
    (`recurrent.TokenByToken`)."""
    return recurrent.recurrent_runner(module)


def _rotary_table(module, walk: _Walk):
    """A segmented model's rotary table on its input embedding's GPU, for the call: a step's first CUDA graph
    records the forward's prologue on that GPU (`hf_sparse_verify.generation.engine.segments`), and accelerate's
    balanced map puts the table with the last layers (8B shape over two GPUs: embedding on GPU 0, ``rotary_emb`` on
    GPU 1), so the prologue would cross GPUs inside the capture. The copy holds only the table's frequencies, and
    no accelerate hook."""
    if (
        not walk.segmented
        or walk.first_device is None
        or not type(module).__name__.endswith("RotaryEmbedding")
    ):
        return None
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    if not buffers or buffers[0].device == walk.first_device:
        return None
    table = copy.deepcopy(module)
    remove_hook_from_module(table)
    return table.to(walk.first_device)


def _decoder_layer(module, walk: _Walk):
    if (
        walk.fused("decoder_layer")
        and decoder_layer.replaceable_decoder_layer(module)
        and compiled_on(module.post_attention_layernorm.weight.device)
    ):
        return decoder_layer.FusedDecoderLayer(module)
    return None


def _dispatching_attention(module, walk: _Walk):
    dispatch = walk.mode.dispatch_attention
    if not (walk.mode.attention if dispatch is None else dispatch):
        return None
    for claims, cls in ATTENTION_REPLACEMENTS:
        if claims(module):
            return cls(module, walk.config)
    return None


def _device(module: torch.nn.Module) -> torch.device:
    """Where a projection's weights live (an ``nn.Linear``'s parameter or a `LowBitLinear`'s packed buffer)."""
    return next(itertools.chain(module.parameters(), module.buffers())).device


def _qkv_attention(module, walk: _Walk):
    if (
        walk.fused("attention")
        and qkv_attention.replaceable_attention(module)
        and swappable(module, in_layer=walk.in_one_device_layer())
        and compiled_on(_device(module.q_proj))
    ):
        return qkv_attention.FusedQKVAttention(module)
    return None


def _norm(module, walk: _Walk):
    if rms_norm.replaceable_norm(module):
        replacement = rms_norm.TritonRMSNorm
    elif rms_norm.replaceable_gated_norm(module):
        replacement = rms_norm.TritonRMSNormGated
    else:
        return None
    if walk.fused("norm") and swappable(module, in_layer=walk.in_one_device_layer()):
        return replacement(module)
    return None


def _mlp(module, walk: _Walk):
    if (
        walk.layer is not None
        and mlp.replaceable_low_bit_mlp(module)
        and walk.fused("mlp")
        and compiled_on(_device(module.gate_proj))
        and swappable(module, in_layer=walk.in_one_device_layer())
    ):
        return mlp.LowBitGatedMLP(module)
    if (
        walk.layer is None
        or not mlp.replaceable_mlp(module)
        or not swappable(module, in_layer=walk.in_one_device_layer())
    ):
        return None
    fused = walk.fused("mlp") and compiled_on(module.gate_proj.weight.device)
    if walk.mode.sparse_ffn or fused:
        return mlp.GatedMLP(module, walk.layer, down_copy=walk.mode.down_copy)
    return None


def _router(module, walk: _Walk):
    if (
        walk.fused("router")
        and router.replaceable_router(module)
        and swappable(module, in_layer=walk.in_one_device_layer())
        and router.fused_router_runs(module.weight.device)
    ):
        return router.FusedRouter(module)
    return None


#: attention modules that do not dispatch through `AttentionInterface`: (which modules, their replacement class,
#: built as ``cls(original, config)`` with the model's text config)
ATTENTION_REPLACEMENTS = (
    (falcon.replaceable_attention, falcon.FalconAttentionDispatch),
    (gptj.replaceable_attention, gptj.GPTJAttentionDispatch),
    (codegen.replaceable_attention, codegen.CodeGenAttentionDispatch),
    (gpt_neo.replaceable_attention, gpt_neo.GPTNeoAttentionDispatch),
    (bloom.replaceable_attention, bloom.BloomAttentionDispatch),
    (mpt.replaceable_attention, mpt.MptAttentionDispatch),
    (xglm.replaceable_attention, xglm.XGLMAttentionDispatch),
    (gpt_neox_japanese.replaceable_attention, gpt_neox_japanese.GPTNeoXJapaneseAttentionDispatch),
    (mla.replaceable_attention, mla.SparseMLAAttention),  # DSA in MLA's latent space: reads only selected rows
)

#: every replacement, in the order a module is offered to them (the first that builds one wins)
RULES = (
    Rule("device_segment", _device_segment, descend=True),
    Rule("token_by_token", _token_by_token, wraps=True),  # the layer's own norm, say, may be fused
    Rule("rotary_table", _rotary_table),
    Rule("decoder_layer", _decoder_layer, descend=True),
    Rule("dispatching_attention", _dispatching_attention),
    Rule("qkv_attention", _qkv_attention),
    Rule("norm", _norm),
    Rule("mlp", _mlp),
    Rule("router", _router),
)


def plan_swaps(model: torch.nn.Module, mode: Mode) -> list[Swap]:
    """The module replacements `speculation_mode` makes in ``model``: one walk of its module tree, parents before
    their children. Tensor-parallel models (DTensor weights) get no fused modules: ours read plain weights and would
    drop the collectives of transformers' tensor-parallel hooks (`speculation_mode` first puts a model whose sharded
    modules `tensor_parallel.local_shard_swaps` covers on its local shards)."""
    if mode.sparse_ffn and sharded(model):  # also on local shards: its calibration is per whole channel
        raise ValueError(
            "the lossy sparse FFN reads whole MLP weights, which tensor parallelism shards: load the model "
            "without tp_plan, or set lossy_sparse_verify.ffn=None"
        )
    if dtensor_weights(model):
        if mode.fused:
            logger.info("hf_sparse_verify: a tensor-parallel model keeps its own modules")
            mode = Mode(attention=mode.attention, dispatch_attention=mode.dispatch_attention)
    config = model.config.get_text_config(decoder=True) if hasattr(model, "config") else None
    segmented = mode.device_segments and spans_gpus(model) and device_segments(model) is not None
    layers = _compat.decoder_layers(model) if mode.sparse_ffn or mode.fused or segmented else []
    if layers is None:
        logger.warning(
            "hf_sparse_verify: no decoder layers found in %s; its MLPs stay as they are", type(model)
        )
    one_device = frozenset(
        i for i, layer in enumerate(layers or []) if len({p.device for p in layer.parameters()}) == 1
    )
    embedding = model.get_input_embeddings() if segmented else None
    walk = _Walk(mode, config, {id(layer): i for i, layer in enumerate(layers or [])}, segmented=segmented,
                 one_device=one_device, first_device=None if embedding is None else embedding.weight.device)  # fmt: skip
    swaps: list[Swap] = []

    def visit(parent: torch.nn.Module) -> None:
        for name, child in list(parent.named_children()):
            outer = walk.layer
            walk.layer = walk.layer_index.get(id(child), outer)
            for rule in RULES:
                replacement = rule.build(child, walk)
                if replacement is not None:
                    swaps.append((parent, name, child, replacement))
                    if rule.descend:
                        visit(replacement)
                    elif rule.wraps:
                        visit(child)
                    break
            else:
                visit(child)
            walk.layer = outer

    visit(model)
    # consecutive fused decoder layers on one device share a launch across their boundary (`FusedDecoderLayer.link`)
    fused = {id(original): new for _, _, original, new in swaps if isinstance(new, decoder_layer.FusedDecoderLayer)}
    for i, (layer, following) in enumerate(zip(layers or [], (layers or [])[1:])):
        first, second = fused.get(id(layer)), fused.get(id(following))
        if first is not None and second is not None and {i, i + 1} <= one_device:
            if next(layer.parameters()).device == next(following.parameters()).device:
                first.link(second)
    return swaps


@dataclass
class Switched:
    """What `speculation_mode` did: the replacements by class (``counts``) and the models it switched."""

    models: tuple[torch.nn.Module, ...]
    mode: Mode
    counts: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def decoding_experts(self) -> Iterator[None]:
        """Within the block, the experts of the switched models run their decoding implementation
        (`experts.decoding_plan`): our fused Triton experts on CUDA, ``batched_mm`` on other accelerators, all on
        ``"hsv_fused"`` under expert skipping. Restored on exit."""
        switched = []
        try:
            for model in self.models:
                plan = experts.decoding_plan(model, self.mode.fused_experts, self.mode.expert_skipping)
                if plan is None:
                    continue
                original = model.get_experts_implementation()
                model.set_experts_implementation(plan)
                switched.append((model, original))
                logger.info(
                    "hf_sparse_verify: %s experts run %s for decoding",
                    type(model).__name__,
                    sorted({v for v in plan.values() if v is not None}),
                )
            yield
        finally:
            for model, original in reversed(switched):
                model.set_experts_implementation(original)


@contextlib.contextmanager
def _swapped(swaps: list[Swap]) -> Iterator[None]:
    done: list[Swap] = []
    try:
        for swap in swaps:
            parent, name, _, replacement = swap
            setattr(parent, name, replacement)
            done.append(swap)
        yield
    finally:
        for parent, name, original, _ in reversed(done):
            setattr(parent, name, original)


@contextlib.contextmanager
def speculation_mode(*models: torch.nn.Module, mode: Mode | None = None, **fields) -> Iterator[Switched]:
    """Put ``models`` into hf_sparse_verify's mode (`Mode`, or its fields as keywords) for the block; yields a
    `Switched`. Every change is logged at INFO and undone on exit, in reverse order, also on errors."""
    if not all(isinstance(m, torch.nn.Module) for m in models):
        raise TypeError(
            "speculation_mode takes models as positional arguments and the Mode as mode=Mode(...)"
        )
    mode = mode if mode is not None else Mode(**fields)
    with contextlib.ExitStack() as stack:  # undone in reverse: configs, then modules, then SDPA backends
        local = []
        for model in models if mode.local_shards else ():
            shards, reason = tensor_parallel.local_shard_swaps(model)
            if reason is not None:
                logger.info("hf_sparse_verify: %s stays on transformers' tensor-parallel modules: %s",
                            type(model).__name__, reason)  # fmt: skip
            local.extend(shards)
        stack.enter_context(_swapped(local))  # the walk below sees the local shards
        swaps = [swap for model in models for swap in plan_swaps(model, mode)]
        counts = dict(Counter(type(new).__name__ for _, _, _, new in local + swaps if
                              not isinstance(new, torch.nn.Linear)))  # fmt: skip
        if mode.attention:
            register_attention()
            stack.enter_context(sdpa_kernel(list(SDPA_BACKENDS)))
        stack.enter_context(_swapped(swaps))
        if counts:
            logger.info(
                "hf_sparse_verify: replaced %s",
                ", ".join(f"{n} {name}" for name, n in sorted(counts.items())),
            )
        if mode.attention:
            stack.enter_context(_attention_implementation(models))
        yield Switched(models, mode, counts)


@contextlib.contextmanager
def _attention_implementation(models) -> Iterator[None]:
    switched = []
    try:
        for model in models:
            previous = _compat.attention_implementations(model.config)
            switched.append((model, previous))  # restored even where switching fails part-way
            _compat.set_attn_implementation(model, ATTENTION_NAME)
        yield
    finally:
        for model, previous in reversed(switched):
            _compat.restore_attn_implementation(model, previous)
