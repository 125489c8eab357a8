"""Every touch of transformers internals lives here, with the versions it was checked against.

- transformers drops ``streamer`` (and ``tokenizer``) before calling a ``custom_generate`` *callable*
  (`GenerationMixin._extract_generation_mode_kwargs` rebuilds the mode kwargs from the callable's own
  parameters). The prompt has already been streamed by then, so we read the streamer back from the ``generate``
  frame that called us (below its decorators: 5.24 adds two). Checked on 5.17.0, 5.23.0 and 5.24.0.
- ``assistant_model`` is dropped the same way (it is a named parameter of ``generate``, never part of the kwargs a
  callable receives); we read it back from that frame too and use it as the draft model. Checked on 5.17.0.
- Architectures are admitted by capability, not by name (`check_architecture`): the engine needs a causal decoder
  whose attention modules write a standard per-layer KV cache and call the function registered with
  `AttentionInterface` (``PreTrainedModel._can_set_attn_implementation``), and whose cache layers are all attention
  layers (``transformers.cache_utils.get_layer_types_and_kwargs``, the function `DynamicCache` builds its layers
  from). Checked on 5.23.0 (the survey of `tests/test_architectures.py`).
- Falcon's attention modules call SDPA themselves (its modelling source has no
  ``ALL_ATTENTION_FUNCTIONS.get_interface(``, so ``_can_set_attn_implementation`` is False and
  ``set_attn_implementation`` only warns). Model types in `ATTENTION_REPLACED_MODEL_TYPES` are admitted anyway:
  `hf_sparse_verify.integrations.speculation_mode` replaces their attention modules for the call, and
  `set_attn_implementation` below writes ``config._attn_implementation`` itself (the property transformers' own
  setter recurses into sub-configs with), which the replacements and the model's ``create_causal_mask`` read.
  ALiBi models (``config.alibi=True``) are refused. Checked on 5.17.0 and 5.23.0 (``modeling_falcon.py``'s attention
  and decoder layer are the same in both).
- GPT-J's and CodeGen's attention modules run their own ``_attn`` the same way; ``gptj`` and ``codegen`` are in
  `ATTENTION_REPLACED_MODEL_TYPES` (`hf_sparse_verify.integrations.gptj`, ``.codegen``). Checked on 5.23.0 (``GPTJBlock``
  and ``CodeGenBlock`` pass ``layer_past``, ``attention_mask`` and
  ``position_ids`` by name and unpacks ``(output, weights)``).
- BLOOM's ``BloomAttention`` and MPT's ``MptAttention`` add ALiBi biases themselves and their models' forwards take
  no ``position_ids``: ``bloom`` and ``mpt`` are in `ATTENTION_REPLACED_MODEL_TYPES` and `ALIBI_MODEL_TYPES`
  (`hf_sparse_verify.integrations.bloom`, ``.mpt``: the biases come from the cache slots, so positions are not
  needed). Checked on 5.24.0.
- XGLM's ``XGLMAttention`` runs its own ``bmm`` / softmax: ``xglm`` is in `ATTENTION_REPLACED_MODEL_TYPES`
  (`hf_sparse_verify.integrations.xglm`). So does GPT-NeoX-Japanese's ``GPTNeoXJapaneseAttention``
  (`hf_sparse_verify.integrations.gpt_neox_japanese`). Checked on 5.24.0.
- GPT-Neo's ``GPTNeoSelfAttention`` (inside ``GPTNeoAttention``) too: ``gpt_neo`` is admitted; its local layers
  pass ``config.window_size`` as the sliding window (`hf_sparse_verify.integrations.gpt_neo` says why the semantics match).
  Checked on 5.23.0.
- Replaced MLPs learn their layer index from the position of their decoder layer in ``get_decoder().layers``
  (`decoder_layers`). Checked on 5.23.0.
- transformers 5.24 renamed the cache argument of model forwards, decoder layers and attention modules from
  ``past_key_values`` to ``cache`` (the old name is deprecated until 5.40) and ``generate`` prepares it under the new
  name: `CACHE_KWARG` is the name this version uses. Checked on 5.17.0, 5.23.0 and 5.24.0.
- Experts modules carry no layer index: `experts_layers` finds them by the attributes transformers'
  ``use_experts_implementation`` sets on them and numbers them by their decoder layer (``get_decoder().layers``,
  the layer's attention ``layer_idx`` where it has one). Checked on 5.23.0.
- `has_forward_hooks` reads torch's ``nn.Module`` hook dicts (own and global), so a replacement that calls an
  experts function directly can fall back where a hook would be skipped. Checked on torch 2.11 and 2.13.
- Gemma 4's decoder (``Gemma4TextModel._maybe_slice_kv_shared_inputs``) cuts a forward's hidden states to the last
  ``logits_to_keep`` positions before its KV-shared layers when ``logits_to_keep`` is an int, so those layers'
  queries no longer match the step's tokens. `last_logit` gives such models the same position as a tensor index,
  which that method leaves alone. Checked on 5.24.0.
- accelerate's ``dispatch_model`` wraps the top module's ``forward`` with an ``AlignDevicesHook`` that moves its
  inputs to the map's "main device" (the first GPU of a set, not the input embedding's), keeping the unwrapped
  method as ``_old_forward``. `forward_on` calls that method where the hook would move the inputs off the GPU they
  are on (a captured step's first piece records on the embedding's GPU and cannot hold a copy to another GPU).
  Checked on accelerate 1.13 and 1.15.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from importlib.metadata import version

import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.generation.utils import GenerationMixin
from transformers.modeling_utils import PreTrainedModel

#: the import check refuses versions outside [MIN, MAX): below MIN is known not to work, and 6 may break the API;
#: pyproject.toml pins the narrower range CI has tested (to 5.24), which the import check does not enforce
from ._version import TRANSFORMERS_MAX, TRANSFORMERS_MIN, check_transformers_version  # noqa: F401

#: the name of the cache argument of model forwards and of ``generate``'s prepared model inputs
CACHE_KWARG = "cache" if Version(version("transformers")) >= Version("5.24.0") else "past_key_values"

#: cache layer kinds our `SpecCache` and attention implement (chunked attention is refused: its mask is not a
#: sliding window; ``indexed_attention``: DSA, keys plus an indexer's keys, `SpecLayer.update_indexer`)
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "indexed_attention"})

#: cache layer kinds whose recurrent state is a short convolution's last inputs, which our `SpecCache` keeps per slot
#: (`hf_sparse_verify.attention.cache.SpecConvLayer`): LFM2's ``conv`` layers
CONV_LAYER_TYPES = frozenset({"conv"})

#: transformers' linear-attention and state-space layer classes whose ``linear_attention`` cache layers (a short
#: convolution, then a recurrent state) our `SpecCache` keeps, and which
#: `hf_sparse_verify.integrations.recurrent.TokenByToken` runs a token at a time in verify steps: a model's
#: ``linear_attention`` layers are kept only when that many of its modules are of these classes
RECURRENT_LAYER_CLASSES = frozenset(
    {
        "Qwen3NextGatedDeltaNet",
        "Qwen3_5GatedDeltaNet",
        "Qwen3_5MoeGatedDeltaNet",
        "OlmoHybridGatedDeltaNet",
        "LaraMiniGatedDeltaNet",
        "Qwen4ExpTextGatedDeltaNet",
        "BambaMixer",
        "JambaMambaMixer",
        "GraniteMoeHybridMambaLayer",
        "NemotronHMamba2Mixer",
        "FalconH1Mixer",
        "ZambaMambaMixer",
        "Zamba2MambaMixer",
        "MambaMixer",
        "FalconMambaMixer",
    }
)

#: Gated DeltaNet classes whose verify steps `hf_sparse_verify.integrations.recurrent.GatedDeltaWindow` runs with
#: the projections, the short convolution and the output once over the step's tokens and only the recurrence token by
#: token, by their projection layout: ``"qkvz"`` (Qwen3-Next: ``in_proj_qkvz`` and ``in_proj_ba``, split by the
#: layer's ``fix_query_key_value_ordering``), ``"qkv"`` (Qwen3.5, Lara-Mini: ``in_proj_qkv``, ``in_proj_z``,
#: ``in_proj_b``, ``in_proj_a``; ``norm``, ``out_proj``) or ``"q_k_v"`` (OLMo-Hybrid: ``q_proj``, ``k_proj``,
#: ``v_proj``, ``g_proj`` (the gate), ``b_proj``, ``a_proj``, beta doubled where ``allow_neg_eigval``; ``o_norm``,
#: ``o_proj``). Other classes of `RECURRENT_LAYER_CLASSES` run whole, a token at a time (`TokenByToken`).
GATED_DELTA_LAYOUTS = {
    "Qwen3NextGatedDeltaNet": "qkvz",
    "Qwen3_5GatedDeltaNet": "qkv",
    "Qwen3_5MoeGatedDeltaNet": "qkv",
    "LaraMiniGatedDeltaNet": "qkv",
    "OlmoHybridGatedDeltaNet": "q_k_v",
}


def gated_delta_functions(layer: torch.nn.Module) -> tuple:
    """``(recurrent_rule, causal_conv1d_fn)`` of a Gated DeltaNet layer's modeling module: the one-token recurrence
    and the causal convolution its own forward calls (transformers' torch functions, or the kernels its hub
    decorators put in their place: fla's fused recurrence, the causal-conv1d package), so a window step computes
    what the layer's one-token calls compute. Raises where the module lacks them (a transformers version that moved
    them)."""
    module = sys.modules[type(layer).__module__]
    functions = tuple(getattr(module, name, None) for name in ("torch_recurrent_gated_delta_rule", "causal_conv1d_fn"))
    if None in functions:
        raise NotImplementedError(
            f"{type(layer).__name__}: transformers {transformers.__version__} has no torch_recurrent_gated_delta_rule "
            "or causal_conv1d_fn beside it; hf_sparse_verify supports transformers 5.17 to 5.24"
        )
    return functions


def mla_rotary(attention: torch.nn.Module):
    """The interleaved rotary function an MLA attention's modeling module applies to its rotary query and key parts
    (``apply_rotary_pos_emb_interleave`` of DeepSeek-V3.2 and GLM-MoE-DSA), so a replacement rotates as the original
    does. Raises where the module lacks it (a transformers version that renamed it)."""
    function = getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb_interleave", None)
    if function is None:
        raise NotImplementedError(
            f"{type(attention).__name__}: transformers {transformers.__version__} has no "
            "apply_rotary_pos_emb_interleave beside it; hf_sparse_verify supports transformers 5.17 to 5.24"
        )
    return function


#: the rotary function each DSA indexer class applies (transformers 5.24.0: DeepSeek-V3.2's indexer rotates its half
#: split, GLM-MoE-DSA's interleaved pairs, unlike their attention which both interleave)
_INDEXER_ROTARY = {
    "DeepseekV32Indexer": "apply_rotary_pos_emb",
    "GlmMoeDsaIndexer": "apply_rotary_pos_emb_interleave",
}


def indexer_rotary(indexer: torch.nn.Module):
    """The rotary function a DSA indexer's modeling module applies to its query and key rotary parts, so a
    replacement that scores the indexer's keys rotates as it does; None for an indexer class not listed (the caller
    keeps the indexer's own forward)."""
    name = _INDEXER_ROTARY.get(type(indexer).__name__)
    return None if name is None else getattr(sys.modules[type(indexer).__module__], name, None)


#: cache layer kinds of `transformers.cache_utils` we cannot hold, and why
_LAYER_TYPE_REASONS = {
    "conv": "convolution layers with a recurrent state (hybrid model)",
    "linear_attention": "linear-attention / state-space layers with a recurrent state (hybrid model)",
    "hybrid": "layers that keep a recurrent state beside their KV cache (hybrid model)",
    "hybrid_sliding": "layers that keep a recurrent state beside their KV cache (hybrid model)",
    "dummy": "layers that reuse another layer's KV cache or have no attention",
    "chunked_attention": "chunked attention (a block-diagonal mask, not a sliding window)",
    "indexed_attention": "a sparse-attention indexer with its own cache",
}

#: model types whose layers keep a recurrent state (no per-token KV cache), refused by name
RECURRENT_MODEL_TYPES = {
    "mamba2": "a state-space model (Mamba-2)",
    "rwkv": "a recurrent model (RWKV)",
    "xlstm": "a recurrent model (xLSTM)",
    "recurrent_gemma": "a recurrent model (Griffin / RG-LRU layers)",
    "reformer": "a model with LSH attention and its own cache",
    "xlnet": "a permutation language model with its own memory",
}

#: attention-based model types whose attention or masking the capability checks below cannot see through
MISMATCHED_MODEL_TYPES = {
    "moshi": "a sliding-window cache under a full causal mask: its prefill attends beyond the window and its "
    "decode steps do not, which no per-layer window reproduces",
    "hrm_text": "decoder layers reused across reasoning cycles, each cycle writing cache slot layer_idx + offset, "
    "so per-layer attention state (Vegas scores, KV selections) cannot be keyed by the module's layer_idx",
    "dory": "recurrent loops over a block of decoder layers (transformers 5.24) that write cache copies past the "
    "model's layers, so per-layer state (Vegas scores, KV selections) and the preallocated cache cannot follow them",
    "git": "a text self-attention class picked once at construction (GIT_SELF_ATTENTION_CLASSES) that never "
    "calls the attention function registered with AttentionInterface",
}

#: model types whose indexers keep the positions of the cached keys on the first indexed cache layer
#: (``indexer_position_ids``, transformers 5.24), appended each call as if the new tokens took the last slots:
#: refused where they have indexed layers, as `SpecCache` does not keep that history per row
INDEXER_POSITION_MODEL_TYPES = frozenset({"qwen4_exp_text"})

#: model types whose attention modules never call the function registered with `AttentionInterface`, but whose
#: rotary attention `hf_sparse_verify.integrations.speculation_mode` replaces, for the call, with modules that do
ATTENTION_REPLACED_MODEL_TYPES = frozenset(
    {"bloom", "codegen", "falcon", "gpt_neo", "gpt_neox_japanese", "gptj", "mpt", "xglm"}
)

#: ALiBi model types whose replaced attention takes its position biases from the cache slots
#: (`hf_sparse_verify.integrations.bloom`, ``.mpt``): their forwards take no ``position_ids`` and need none
ALIBI_MODEL_TYPES = frozenset({"bloom", "mpt"})

#: model types whose forward calls ``.to(torch.bool)`` on ``create_causal_mask``'s result (MPT, 5.24.0), which the
#: ``"sparse_verify"`` mask function otherwise returns as None: they get a placeholder tensor nothing reads
MASK_TENSOR_MODEL_TYPES = frozenset({"mpt"})

#: config fields that only hybrid recurrent/attention models have
_HYBRID_CONFIG_FIELDS = (
    "attn_layer_indices",
    "attn_layer_period",
    "layers_block_type",
    "hybrid_override_pattern",
    "block_types",
    "mamba_d_state",
    "mamba_n_heads",
    "mamba_expand",
    "ssm_state_size",
    "linear_num_key_heads",
    "linear_conv_kernel_dim",
)


def check_architecture(model) -> None:
    """Raise `NotImplementedError` naming what is missing when ``model`` is not a causal decoder whose attention
    goes through `AttentionInterface` over a standard KV cache; return None otherwise.

    The checks, in order: encoder-decoder (a config that says so, or decoder layers that cross-attend to an
    encoder); other non-causal cross-attention; bidirectional attention; recurrent models (by name, or a class that
    keeps a custom cache); hybrid recurrent/attention layers; a forward without ``position_ids``; ALiBi position biases;
    attention modules that do not dispatch through `AttentionInterface` (unless we replace them:
    `ATTENTION_REPLACED_MODEL_TYPES`); cache layer kinds other than full and sliding-window attention.
    """
    reason = architecture_refusal(model)
    if reason is not None:
        raise NotImplementedError(reason)


#: what a refused model's user can do instead: transformers' own decoding, plain or assisted (its assisted
#: generation crops a standard cache, one prompt at a time; it does not roll back recurrent states)
INSTEAD_PLAIN = "; instead, call model.generate() without custom_generate (transformers' plain decoding)"
INSTEAD_ASSISTED = (
    "; instead, use transformers' own assisted generation, one prompt at a time: model.generate(..., "
    "prompt_lookup_num_tokens=10) or model.generate(..., assistant_model=draft)"
)


def architecture_refusal(model) -> str | None:
    """Why ``model`` is refused (one sentence naming the model type and what is missing), or None."""
    config = model.config
    text = config.get_text_config(decoder=True)
    cls = type(model).__name__
    prefix = f"model type {text.model_type!r} ({cls}) is not supported:"
    if getattr(config, "is_encoder_decoder", False) or getattr(text, "is_encoder_decoder", False):
        return (
            f"{prefix} it is an encoder-decoder model; hf_sparse_verify supports decoder-only causal LMs"
            + (INSTEAD_ASSISTED)
        )
    if getattr(text, "causal", True) is False:
        return (
            f"{prefix} its attention is bidirectional (config.causal=False); hf_sparse_verify needs a causal LM"
            + INSTEAD_PLAIN
        )
    kind, where = _non_causal_attention(model)
    if kind == "encoder_decoder":
        return (
            f"{prefix} it is the decoder of an encoder-decoder model: its layers cross-attend to an encoder's "
            f"output ({where}); hf_sparse_verify supports decoder-only causal LMs" + INSTEAD_ASSISTED
        )
    if kind == "cross":
        return (
            f"{prefix} it has a non-causal cross-attention ({where}), which the 'sparse_verify' attention does not "
            f"implement (it runs causal self-attention over the KV cache)" + INSTEAD_PLAIN
        )
    if kind == "bidirectional":
        return (
            f"{prefix} its self-attention ({where}) is bidirectional; a BERT-style model generates causally "
            f"only when built with config.is_decoder=True" + INSTEAD_PLAIN
        )
    if text.model_type in RECURRENT_MODEL_TYPES:
        return (
            f"{prefix} it is {RECURRENT_MODEL_TYPES[text.model_type]}, with no KV cache to roll back"
            + INSTEAD_PLAIN
        )
    if text.model_type in MISMATCHED_MODEL_TYPES:
        return f"{prefix} it has {MISMATCHED_MODEL_TYPES[text.model_type]}" + INSTEAD_PLAIN
    supports_dynamic = getattr(type(model), "_supports_default_dynamic_cache", None)
    if supports_dynamic is not None and not supports_dynamic():
        return (
            f"{prefix} it keeps its own recurrent or custom cache instead of a standard KV cache"
            + INSTEAD_PLAIN
        )
    hybrid = [name for name in _HYBRID_CONFIG_FIELDS if getattr(text, name, None) is not None]
    if hybrid and not _linear_types(model):
        return (
            f"{prefix} it mixes recurrent (state-space / linear-attention) layers with attention (config has "
            f"{', '.join(hybrid)}); their state cannot be rolled back after rejected drafts" + INSTEAD_PLAIN
        )
    layers = getattr(text, "num_hidden_layers", None)
    if layers and (getattr(text, "num_kv_shared_layers", None) or 0) >= layers:
        return (
            f"{prefix} every layer reads another model's KV cache (an assistant of a Gemma 4 target: "
            f"num_kv_shared_layers covers all {layers} layers), so it cannot run alone; instead, give it to "
            f"transformers' generate of its target as assistant_model"
        )
    forward_args = inspect.signature(type(model).forward).parameters
    if "cache" not in forward_args and "past_key_values" not in forward_args:
        return (
            f"{prefix} it keeps no KV cache (its forward takes none: every step runs the whole sequence again), so "
            f"there is no cache to verify drafts into or roll back" + INSTEAD_PLAIN
        )
    if text.model_type in INDEXER_POSITION_MODEL_TYPES and indexed_attention(config):
        return (
            f"{prefix} its indexer keeps the positions of the cached keys as a history on the cache "
            f"(indexer_position_ids), extended each call as if the new tokens took the last slots, which does not "
            f"hold for rows that accepted different numbers of drafts" + INSTEAD_PLAIN
        )
    # a model of recurrent layers only (Mamba) has no positions to get wrong
    recurrent_only = bool(_linear_types(model)) and set(_layer_types(model)) <= _linear_types(model)
    if "position_ids" not in forward_args and text.model_type not in ALIBI_MODEL_TYPES and not recurrent_only:
        return (
            f"{prefix} its forward takes no position_ids (it derives positions from the cache length), so rows at "
            f"different lengths (left padding, different numbers of accepted drafts) would get wrong positions"
            + INSTEAD_ASSISTED
        )
    if getattr(text, "alibi", False) is True:
        return (
            f"{prefix} it adds ALiBi position biases to the attention logits (config.alibi=True), which the "
            f"'sparse_verify' attention does not implement; only its rotary variant (config.alibi=False) is supported"
            + INSTEAD_ASSISTED
        )
    for module in model.modules():
        if (
            isinstance(module, PreTrainedModel)
            and not _dispatches_attention(type(module))
            and module.config.model_type not in ATTENTION_REPLACED_MODEL_TYPES
        ):
            return (
                f"{prefix} the attention of {type(module).__name__} does not dispatch through transformers' "
                f"AttentionInterface (ALL_ATTENTION_FUNCTIONS), so the 'sparse_verify' attention cannot run it"
                + INSTEAD_ASSISTED
            )
    try:
        layer_types, _ = get_layer_types_and_kwargs(text)
    except Exception as e:  # noqa: BLE001 - a config without per-layer structure
        return f"{prefix} its cache layer types cannot be read ({type(e).__name__}: {e})" + INSTEAD_PLAIN
    unknown = sorted(
        set(layer_types)
        - ATTENTION_LAYER_TYPES
        - CONV_LAYER_TYPES
        - _linear_types(model)
        - _cacheless(text, layer_types)
    )
    if unknown:
        why = "; ".join(
            f"{kind!r}: {_LAYER_TYPE_REASONS.get(kind, 'a cache layer kind we do not implement')}"
            for kind in unknown
        )
        return f"{prefix} it has cache layers of kind {why}" + INSTEAD_PLAIN
    return None


def _cacheless(text, layer_types: list[str]) -> frozenset:
    """``{"dummy"}`` where every ``dummy`` cache layer is an MLP or MoE block (no attention, no cache: Nemotron-H's
    ``moe`` / ``mlp`` layers) or an attention layer that reads an earlier layer's keys and values (Gemma 3n's and
    Gemma 4's ``kv_sharing_modes`` "reuse" layers: their attention is given the cache buffers that layer's update
    returned, and writes none); else empty."""
    raw = getattr(text, "layer_types", None) or []
    sources = _kv_sources(text)
    dummies = [i for i, kind in enumerate(layer_types) if kind == "dummy"]

    def passes(i: int) -> bool:
        return (i < len(raw) and len(raw) == len(layer_types) and raw[i] in ("moe", "mlp")) or i in sources

    if dummies and all(passes(i) for i in dummies):
        return frozenset({"dummy"})
    return frozenset()


def _kv_sources(text) -> dict[int, int]:
    """Per KV-shared layer (``kv_sharing_modes`` "reuse": Gemma 3n, Gemma 4), the earlier layer whose keys and values
    it reads: the "store" layer of its attention kind. A shared layer without one is left out (refused)."""
    modes = getattr(text, "kv_sharing_modes", None) or []
    kinds = getattr(text, "layer_types", None) or []
    if len(modes) != len(kinds):
        return {}
    stores = {kinds[j]: j for j, mode in enumerate(modes) if mode == "store"}
    return {
        i: stores[kinds[i]] for i, mode in enumerate(modes) if mode == "reuse" and stores.get(kinds[i], i) < i
    }


_INDEXED: dict[int, tuple] = {}  # id(config) -> (weak reference to it, answer): asked at every forward's mask


def indexed_attention(config) -> bool:
    """Whether ``config``'s model has DSA indexer layers (transformers' ``indexed_attention`` cache layers:
    DeepSeek-V3.2, GLM-MoE-DSA), whose indexer reads the causal mask and the attention gets top-k ``indices``."""
    known = _INDEXED.get(id(config))
    if known is not None and known[0]() is config:
        return known[1]
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    answer = "indexed_attention" in _config_layer_types(text)
    try:
        _INDEXED[id(config)] = (weakref.ref(config), answer)
    except TypeError:  # not weakly referable: not cached
        pass
    return answer


def kv_shared_sources(model) -> dict[int, int]:
    """``{shared layer: the layer whose keys and values it reads}`` for models with KV-shared layers; else empty."""
    return _kv_sources(model.config.get_text_config(decoder=True))


def _config_layer_types(text) -> list[str]:
    """The cache layer kinds of text config ``text`` (empty where it has no per-layer structure)."""
    try:
        return get_layer_types_and_kwargs(text)[0]
    except Exception:  # noqa: BLE001 - no per-layer structure: `architecture_refusal` says so
        return []


def _layer_types(model) -> list[str]:
    """``model``'s cache layer kinds (empty where its config has no per-layer structure)."""
    return _config_layer_types(model.config.get_text_config(decoder=True))


def _linear_types(model) -> frozenset:
    """The recurrent cache layer kinds of ``model`` we keep: ``linear_attention`` (a mixer alone) and ``hybrid`` (a
    mixer beside attention: Falcon-H1, Zamba) where every such layer has a module of `RECURRENT_LAYER_CLASSES` to
    run it; else empty."""
    types = _layer_types(model)
    present = frozenset(kind for kind in ("linear_attention", "hybrid") if kind in types)
    wrapped = sum(type(m).__name__ in RECURRENT_LAYER_CLASSES for m in model.modules())
    return present if present and wrapped == sum(types.count(kind) for kind in present) else frozenset()


def cache_is_empty(cache) -> bool:
    """Whether a transformers ``Cache`` holds nothing yet. ``get_seq_length`` raises on a cache of recurrent layers
    only (a pure state-space model's, transformers 5.24: it counts attention layers); there, no layer is
    initialized."""
    try:
        return cache.get_seq_length() == 0
    except ValueError:
        return not any(getattr(layer, "is_initialized", False) for layer in getattr(cache, "layers", ()))


def recurrent_layer_indices(model) -> list[int]:
    """Indices of ``model``'s recurrent cache layers we keep (`CONV_LAYER_TYPES`, and ``linear_attention`` and
    ``hybrid`` layers run by `RECURRENT_LAYER_CLASSES`); empty for attention-only models."""
    kept = CONV_LAYER_TYPES | _linear_types(model)
    return [i for i, kind in enumerate(_layer_types(model)) if kind in kept]


def hybrid_layer_indices(model) -> list[int]:
    """Indices of ``model``'s kept ``hybrid`` cache layers (recurrent state and KV in one layer)."""
    kept = _linear_types(model)
    return [i for i, kind in enumerate(_layer_types(model)) if kind == "hybrid" and kind in kept]


def set_attn_implementation(model, name: str) -> None:
    """Switch ``model`` to the attention implementation ``name``: transformers' ``set_attn_implementation``, except
    for model types in `ATTENTION_REPLACED_MODEL_TYPES` (there that method only warns), whose
    ``config._attn_implementation`` is written directly. Call it for those only while their attention modules are
    replaced (`hf_sparse_verify.integrations.speculation_mode`): their own modules do not run under a
    registered name (ALiBi models, whose modules are never replaced, keep transformers' behaviour)."""
    config = model.config
    replaced = config.model_type in ATTENTION_REPLACED_MODEL_TYPES and not getattr(config, "alibi", False)
    if replaced and not _dispatches_attention(type(model)):
        config._attn_implementation = name
    else:
        model.set_attn_implementation(name)


def attention_implementations(config) -> str | dict | None:
    """The attention implementation of ``config`` and of each of its sub-configs, in the nested form
    ``set_attn_implementation`` takes (``{"": own, "<sub_config>": ...}``; a plain name without sub-configs): a
    composite model's parts may differ (Gemma 4: its text model SDPA, its audio model eager, which has no SDPA, or
    unset)."""
    parts = {
        key: attention_implementations(sub)
        for key in getattr(config, "sub_configs", {})
        if (sub := getattr(config, key, None)) is not None
    }
    return {"": config._attn_implementation, **parts} if parts else config._attn_implementation


def restore_attn_implementation(model, previous: str | dict | None) -> None:
    """Put back what `attention_implementations` read before a switch: the
    config's own setter writes each part's value as it was, unset (None) parts included, which
    ``set_attn_implementation`` would refuse (it resolves and checks every value, and None is not one)."""
    model.config._attn_implementation = previous


def layer_sliding_window(module, passed: int | None) -> int | None:
    """The sliding window of ``module``'s layer: the one passed to the attention function, else the window that
    transformers' mask for this layer applies (the layer's cache type from the config). Moshi, Kyutai
    speech-to-text and Qwen2-MoE (5.17) keep ``sliding_window`` on the module but pass none to the attention
    function, relying on the mask transformers builds; Exaone 4 keeps it on full-attention layers too, so the
    attribute alone does not say."""
    if passed is not None or getattr(module, "sliding_window", None) is None:
        return passed
    if module not in _LAYER_WINDOWS:  # once per module: this runs in every attention call of eager steps
        layer_types, layer_kwargs = get_layer_types_and_kwargs(module.config.get_text_config(decoder=True))
        sliding = layer_types[module.layer_idx] == "sliding_attention"
        _LAYER_WINDOWS[module] = layer_kwargs[module.layer_idx]["sliding_window"] if sliding else None
    return _LAYER_WINDOWS[module]


#: `layer_sliding_window`'s answers, per attention module (forgotten with the module)
_LAYER_WINDOWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_experts_module(module) -> bool:
    """Whether ``module`` is a transformers experts block dispatched through `ExpertsInterface` (its class is
    decorated with ``use_experts_implementation``, whose ``__init__`` sets these attributes)."""
    return all(hasattr(module, name) for name in ("has_gate", "is_transposed", "is_concatenated", "config"))


def has_forward_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` runs forward hooks or pre-hooks, its own or torch's global ones (torch internals: the hook
    dicts of ``nn.Module``). A replacement that calls the module's function without ``__call__``
    (`hf_sparse_verify.integrations.FusedDecoderLayer` handing a residual to the fused experts) would skip them."""
    from torch.nn.modules import module as torch_module

    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    )


def experts_layers(model) -> dict:
    """``{experts module: layer index}`` for the experts blocks of ``model``'s decoder layers (the cache layer index:
    the layer's attention ``layer_idx`` where it has one, else its position in ``get_decoder().layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        return {}
    found = {}
    for position, layer in enumerate(layers):
        indices = [m.layer_idx for m in layer.modules() if isinstance(getattr(m, "layer_idx", None), int)]
        index = indices[0] if indices else position
        for module in layer.modules():
            if is_experts_module(module):
                found[module] = index
    return found


def _non_causal_attention(model) -> tuple[str | None, str]:
    """What non-causal attention the text decoder has, and where: ``("encoder_decoder", ...)`` when its layers
    cross-attend to an encoder (an ``encoder_attn`` module: the decoder of BART, Whisper, ...); ``("cross", ...)``
    for another non-causal cross-attention (BLT's); ``("bidirectional", ...)`` for a non-causal self-attention
    (BERT-style models built without ``config.is_decoder=True``); ``(None, "")`` for none."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    found: dict[str, str] = {}
    for name, module in decoder.named_modules():
        if name.endswith("encoder_attn"):
            found.setdefault("encoder_decoder", f"{name}: {type(module).__name__}")
        elif getattr(module, "is_causal", True) is False and hasattr(module, "layer_idx"):
            cross = "cross" in name or "CrossAttention" in type(module).__name__
            found.setdefault("cross" if cross else "bidirectional", f"{name}: {type(module).__name__}")
    for kind in ("encoder_decoder", "cross", "bidirectional"):
        if kind in found:
            return kind, found[kind]
    return None, ""


def _dispatches_attention(cls: type) -> bool:
    """transformers' own test (``PreTrainedModel._can_set_attn_implementation``, cached per class: it reads the
    modelling module's source for ``ALL_ATTENTION_FUNCTIONS.get_interface(``) that ``set_attn_implementation``
    switches this class's attention."""
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    return bool(can_set()) if can_set is not None else False


def _generate_argument(name: str):
    """The argument ``name`` of the innermost `GenerationMixin.generate` call that is running us, if any."""
    code = inspect.unwrap(GenerationMixin.generate).__code__  # 5.24 wraps it in two deprecation decorators
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code is code:
                return frame.f_locals.get(name)
            frame = frame.f_back
    finally:
        del frame
    return None


def recover_streamer():
    """The ``streamer`` argument of the `GenerationMixin.generate` call that is running us, if any."""
    return _generate_argument("streamer")


def recover_assistant_model():
    """The ``assistant_model`` argument of the `GenerationMixin.generate` call that is running us, if any."""
    return _generate_argument("assistant_model")


__all__ = [
    "ATTENTION_LAYER_TYPES",
    "CONV_LAYER_TYPES",
    "RECURRENT_LAYER_CLASSES",
    "GATED_DELTA_LAYOUTS",
    "gated_delta_functions",
    "recurrent_layer_indices",
    "ATTENTION_REPLACED_MODEL_TYPES",
    "MISMATCHED_MODEL_TYPES",
    "RECURRENT_MODEL_TYPES",
    "layer_sliding_window",
    "architecture_refusal",
    "check_architecture",
    "check_transformers_version",
    "decoder_layers",
    "experts_layers",
    "forward_on",
    "indexed_attention",
    "hybrid_layer_indices",
    "kv_shared_sources",
    "last_logit",
    "is_experts_module",
    "recover_assistant_model",
    "recover_streamer",
    "set_attn_implementation",
    "restore_attn_implementation",
    "attention_implementations",
    "transformers",
]


def last_logit(model: torch.nn.Module) -> int | torch.Tensor:
    """``logits_to_keep`` for each row's last position only: 1, or ``tensor([-1])`` for models with KV-shared layers
    (Gemma 4 would otherwise run those layers on the last position alone)."""
    text = model.config.get_text_config(decoder=True)
    return torch.tensor([-1]) if "reuse" in (getattr(text, "kv_sharing_modes", None) or ()) else 1


def forward_on(model: torch.nn.Module, device: torch.device):
    """What to call for a forward of ``model`` whose inputs are on ``device``: the model itself, or, where
    accelerate's top-level hook would move them to another device first (its device map's main device is not
    ``device``), the model's forward without that hook. The layers' own hooks still place every layer's inputs, and
    the logits stay where the head computes them."""
    hook = getattr(model, "_hf_hook", None)
    target = getattr(hook, "execution_device", None)
    forward = getattr(model, "_old_forward", None)
    if target is None or forward is None:
        return model
    if isinstance(target, int):
        target = torch.device("cuda", target)
    return model if torch.device(target) == torch.device(device) else forward


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The decoder layers of ``model`` in order (the position of a layer is its ``layer_idx``), or None.

    ``model.get_decoder().layers`` for every Llama-family model of transformers 5 (checked on 5.23.0: Llama,
    Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE); otherwise the first ``ModuleList`` as long as the text config's
    ``num_hidden_layers``."""
    try:
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    except (AttributeError, NotImplementedError, ValueError):
        decoder = model
    layers = getattr(decoder, "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    config = getattr(model, "config", None)
    text = config.get_text_config(decoder=True) if config is not None else None
    count = getattr(text, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and count is not None and len(module) == count:
            return module
    return None
