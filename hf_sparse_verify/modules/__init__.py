"""Module replacement for the fast path: swap known transformers modules for fused-kernel equivalents for the
duration of a call, log it, and put the originals back on exit (also on errors).

Only modules whose ``forward`` arithmetic we have checked are replaced (`REPLACEABLE` RMSNorms, `MLP_REPLACEABLE`
MLPs, `FUSED_ATTENTION_REPLACEABLE` Llama-family attention, `ROUTER_REPLACEABLE` MoE routers); each replacement
reads the attributes it declares (``reads``) and holds no state of its own beyond a lazily built transposed weight
(`GatedMLP`).

`use_dispatching_attention` is not a speed-up but a way in: it replaces attention modules whose transformers
``forward`` never calls the function registered with `AttentionInterface` (`ATTENTION_REPLACEMENTS`: Falcon's,
GPT-J's, CodeGen's, GPT-Neo's) by modules that do, on every device and backend; `hf_sparse_verify.attention.use_sparse_verify_attention` applies it.

Tensor-parallel models (weights sharded as DTensors by ``tp_plan="auto"``) keep their own modules: ours read plain
weights and would drop the collectives of transformers' tensor-parallel hooks. So do modules that accelerate hooks
or whose weights are offloaded (`hf_sparse_verify.placement.swappable`): a replacement would not carry the hook.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from .._compat import decoder_layers
from ..kernels._triton import compiled_on
from ..placement import swappable, tensor_parallel
from .attention import REPLACEABLE as FUSED_ATTENTION_REPLACEABLE
from .attention import FusedQKVAttention
from .attention import replaceable_attention as _fused_attention_replaceable
from .codegen import REPLACEABLE as _CODEGEN_REPLACEABLE
from .codegen import CodeGenAttentionDispatch
from .codegen import replaceable_attention as _codegen_replaceable
from .decoder_layer import REPLACEABLE as DECODER_LAYER_REPLACEABLE
from .decoder_layer import FusedDecoderLayer, replaceable_decoder_layer
from .falcon import REPLACEABLE as _FALCON_REPLACEABLE
from .falcon import FalconAttentionDispatch
from .falcon import replaceable_attention as _falcon_replaceable
from .gpt_neo import REPLACEABLE as _GPT_NEO_REPLACEABLE
from .gpt_neo import GPTNeoAttentionDispatch
from .gpt_neo import replaceable_attention as _gpt_neo_replaceable
from .gptj import REPLACEABLE as _GPTJ_REPLACEABLE
from .gptj import GPTJAttentionDispatch
from .gptj import replaceable_attention as _gptj_replaceable
from .mlp import REPLACEABLE as MLP_REPLACEABLE
from .mlp import GatedMLP, replaceable_mlp
from .rms_norm import REPLACEABLE, TritonRMSNorm
from .router import REPLACEABLE as ROUTER_REPLACEABLE
from .router import FusedRouter, router_swaps

logger = logging.getLogger(__name__)

__all__ = [
    "ATTENTION_REPLACEABLE",
    "MLP_REPLACEABLE",
    "REPLACEABLE",
    "ATTENTION_REPLACEMENTS",
    "FUSED_ATTENTION_REPLACEABLE",
    "CodeGenAttentionDispatch",
    "DECODER_LAYER_REPLACEABLE",
    "FusedDecoderLayer",
    "FalconAttentionDispatch",
    "FusedQKVAttention",
    "FusedRouter",
    "ROUTER_REPLACEABLE",
    "GPTJAttentionDispatch",
    "GPTNeoAttentionDispatch",
    "GatedMLP",
    "TritonRMSNorm",
    "replaceable_attention",
    "replaceable_decoder_layer",
    "replaceable_mlp",
    "use_dispatching_attention",
    "use_fused_modules",
    "use_sparse_ffn",
]

Swap = tuple[torch.nn.Module, str, torch.nn.Module, torch.nn.Module]  # parent, name, original, replacement

#: class names of the attention modules `use_dispatching_attention` may replace
ATTENTION_REPLACEABLE = _FALCON_REPLACEABLE | _GPTJ_REPLACEABLE | _CODEGEN_REPLACEABLE | _GPT_NEO_REPLACEABLE

#: attention modules that do not dispatch through `AttentionInterface`: (which modules, their replacement class,
#: built as ``cls(original, config)`` with the model's text config)
ATTENTION_REPLACEMENTS = (
    (_falcon_replaceable, FalconAttentionDispatch),
    (_gptj_replaceable, GPTJAttentionDispatch),
    (_codegen_replaceable, CodeGenAttentionDispatch),
    (_gpt_neo_replaceable, GPTNeoAttentionDispatch),
)


def replaceable_attention(module: torch.nn.Module) -> bool:
    """Whether `use_dispatching_attention` replaces ``module`` (an entry of `ATTENTION_REPLACEMENTS` claims it)."""
    return any(claims(module) for claims, _ in ATTENTION_REPLACEMENTS)


def _attention_replacement(module: torch.nn.Module, config) -> torch.nn.Module | None:
    for claims, replacement in ATTENTION_REPLACEMENTS:
        if claims(module):
            return replacement(module, config)
    return None


def _norm_swaps(model: torch.nn.Module) -> list[Swap]:
    return [
        (parent, name, child, TritonRMSNorm(child))
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if type(child).__name__ in REPLACEABLE and swappable(child)
    ]


def _attention_swaps(model: torch.nn.Module) -> list[Swap]:
    """Every attention module of ``model`` an `ATTENTION_REPLACEMENTS` entry claims, with its replacement (given the
    model's text config, for attention modules that keep none: CodeGen's)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model, "config") else None
    return [
        (parent, name, child, replacement)
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if (replacement := _attention_replacement(child, config)) is not None
    ]


def _mlp_swaps(model: torch.nn.Module, down_copy: bool, cuda_only: bool = False) -> list[Swap]:
    """Every replaceable MLP inside a decoder layer of ``model`` (with ``cuda_only``: only those whose weights are
    where the fused kernel runs), with the index of that layer."""
    layers = decoder_layers(model)
    if layers is None:
        logger.warning(
            "hf_sparse_verify: no decoder layers found in %s; its MLPs stay as they are", type(model)
        )
        return []
    return [
        (parent, name, child, GatedMLP(child, layer_idx, down_copy=down_copy))
        for layer_idx, layer in enumerate(layers)
        for parent in list(layer.modules())
        for name, child in list(parent.named_children())
        if replaceable_mlp(child)
        and swappable(child)
        and (not cuda_only or compiled_on(child.gate_proj.weight.device))
    ]


def _fused_attention_swaps(model: torch.nn.Module) -> list[Swap]:
    """Every Llama-family attention module of ``model`` (`FUSED_ATTENTION_REPLACEABLE`) whose projections are where
    the fused kernels run, with its `FusedQKVAttention`."""
    return [
        (parent, name, child, FusedQKVAttention(child))
        for parent in list(model.modules())
        for name, child in list(parent.named_children())
        if _fused_attention_replaceable(child)
        and swappable(child)
        and compiled_on(child.q_proj.weight.device)
    ]


def _decoder_layer_swaps(model: torch.nn.Module) -> list[Swap]:
    """Every decoder layer of ``model`` that `replaceable_decoder_layer` accepts and whose post-attention norm is
    where the fused kernels run, with its `FusedDecoderLayer`."""
    layers = decoder_layers(model)
    if layers is None:
        return []
    return [
        (layers, str(i), layer, FusedDecoderLayer(layer))
        for i, layer in enumerate(layers)
        if replaceable_decoder_layer(layer) and compiled_on(layer.post_attention_layernorm.weight.device)
    ]


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
def use_dispatching_attention(*models: torch.nn.Module) -> Iterator[int]:
    """Within the block, every attention module of ``models`` for which `replaceable_attention` holds (rotary
    Falcon's, GPT-J's, CodeGen's, GPT-Neo's) is replaced by its `ATTENTION_REPLACEMENTS` class (e.g. `FalconAttentionDispatch`), sharing
    its projections, which calls the attention function named by ``config._attn_implementation`` through
    `AttentionInterface`; yields how many modules were replaced. The
    originals are back on exit, also on errors.

    Example:
        >>> from transformers import FalconConfig, FalconForCausalLM
        >>> model = FalconForCausalLM(FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ...     vocab_size=50))
        >>> with use_dispatching_attention(model) as count:
        ...     print(count, type(model.transformer.h[1].self_attention).__name__)
        2 FalconAttentionDispatch
        >>> type(model.transformer.h[1].self_attention).__name__
        'FalconAttention'
    """
    swaps = [swap for model in models for swap in _attention_swaps(model)]
    with _swapped(swaps):
        if swaps:
            logger.info(
                "hf_sparse_verify: %d attention modules (%s) dispatch through AttentionInterface",
                len(swaps),
                ", ".join(sorted({type(original).__name__ for _, _, original, _ in swaps})),
            )
        yield len(swaps)


@contextlib.contextmanager
def use_fused_modules(
    *models: torch.nn.Module,
    mlp: bool = True,
    attention: bool = True,
    router: bool = True,
    decoder_layers: bool = True,
) -> Iterator[int]:
    """Within the block, every RMSNorm of ``models`` whose class is in `REPLACEABLE` is a `TritonRMSNorm` sharing its
    weight; (``mlp=True``) every bias-free SiLU MLP in `MLP_REPLACEABLE` whose weights are on a CUDA device is a
    `GatedMLP` (the fused ``silu(gate) * up`` kernel; the sparse FFN on verify steps that ask for it); and
    (``attention=True``) every Llama-family attention module in `FUSED_ATTENTION_REPLACEABLE` whose weights are on a
    CUDA device is a `FusedQKVAttention` (q/k/v projections in one launch, norm and rotary in another); and
    (``router=True``) every MoE router in `ROUTER_REPLACEABLE` on a CUDA device is a `FusedRouter` (logits, softmax,
    top-k and normalisation in one launch); and (``decoder_layers=True``) every Llama-family decoder layer in
    `DECODER_LAYER_REPLACEABLE` on a CUDA device is a `FusedDecoderLayer` (each residual add shares a launch with
    the post-attention norm or the fused experts); yields how many modules were replaced. Modules elsewhere stay as
    they are (the replacements would compute exactly what they compute); `use_sparse_ffn` replaces MLPs on any
    device."""
    sharded = [m for m in models if tensor_parallel(m)]
    if sharded:  # our modules read plain weights and would drop the collectives of transformers' TP hooks
        logger.info("hf_sparse_verify: %d tensor-parallel models keep their own modules", len(sharded))
        models = tuple(m for m in models if not tensor_parallel(m))
    layers = [swap for model in models for swap in _decoder_layer_swaps(model)] if decoder_layers else []
    with _swapped(layers):  # first: the other swaps then find their modules inside the replaced layers
        attentions = [swap for model in models for swap in _fused_attention_swaps(model)] if attention else []
        norms = [swap for model in models for swap in _norm_swaps(model)]
        mlps = [swap for model in models for swap in _mlp_swaps(model, True, cuda_only=True)] if mlp else []
        routers = [swap for model in models for swap in router_swaps(model, cuda_only=True)] if router else []
        with _swapped(attentions + norms + mlps + routers):
            if layers:
                logger.info("hf_sparse_verify: %d decoder layers run as FusedDecoderLayer", len(layers))
            if attentions:
                logger.info(
                    "hf_sparse_verify: %d attention modules run as FusedQKVAttention", len(attentions)
                )
            if norms:
                logger.info("hf_sparse_verify: %d RMSNorm modules run the fused Triton kernel", len(norms))
            if mlps:
                logger.info(
                    "hf_sparse_verify: %d MLP modules run as GatedMLP (fused / sparse FFN)", len(mlps)
                )
            if routers:
                logger.info("hf_sparse_verify: %d MoE routers run as FusedRouter", len(routers))
            yield len(layers) + len(attentions) + len(norms) + len(mlps) + len(routers)


@contextlib.contextmanager
def use_sparse_ffn(*models: torch.nn.Module, down_copy: bool = True) -> Iterator[int]:
    """Within the block, every bias-free SiLU MLP of ``models`` in `MLP_REPLACEABLE` is a `GatedMLP`, on any device
    (CPU included: quality measurements of the sparse FFN), so verify steps whose `VerifySparsity` gives an FFN
    threshold run the sparse FFN; yields how many MLPs were replaced. MLPs already replaced (an enclosing
    `use_fused_modules`) are left as they are.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        ...     num_attention_heads=2, vocab_size=50))
        >>> with use_sparse_ffn(model) as count:
        ...     print(count, [m.layer_idx for m in model.modules() if isinstance(m, GatedMLP)])
        2 [0, 1]
        >>> type(model.model.layers[0].mlp).__name__
        'LlamaMLP'
    """
    if any(tensor_parallel(m) for m in models):
        raise ValueError(
            "the lossy sparse FFN reads whole MLP weights, which tensor parallelism shards: load the model without "
            "tp_plan, or set lossy_sparse_verify.ffn=None"
        )
    mlps = [swap for model in models for swap in _mlp_swaps(model, down_copy=down_copy)]
    with _swapped(mlps):
        if mlps:
            logger.info(
                "hf_sparse_verify: %d MLP modules run as GatedMLP (sparse FFN on verify steps)", len(mlps)
            )
        yield len(mlps)
