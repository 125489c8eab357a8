"""Survey of every causal LM in transformers' registry: a tiny random model per ``model_type``, plain greedy
``generate`` against ``hf_sparse_verify`` (prompt_lookup and vegas), float32, a left-padded batch of 2.

Each architecture ends in one of: ``identical`` (every strategy token-identical), ``refused`` (our call raised
`NotImplementedError` before generating; the reason is kept), ``skipped`` (no tiny model could be built offline,
or plain ``generate`` itself fails), ``different`` or ``crashed`` (bugs: the test fails on them). Used by
``tests/test_architectures.py`` and ``scripts/supported_models.py``.
"""

from __future__ import annotations

import dataclasses
import re
import traceback

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hf_sparse_verify as hsv

VOCAB = 96
PAD, EOS, BOS = 0, 1, 2
#: vegas drafts from a real selection (30% of the prefix, at least 4 slots), so sparse draft steps run too
STRATEGIES = {
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
}
MAX_NEW = 12
MAX_PARAMS = 25_000_000

#: integer config fields shrunk to a tiny size wherever a config has them
_SMALL_INTS = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "n_embd": 64,
    "d_model": 64,
    "dim": 64,
    "intermediate_size": 96,
    "n_inner": 96,
    "ffn_dim": 96,
    "ffn_hidden_size": 96,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "num_key_value_heads": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "rotary_dim": 8,
    "attention_hidden_size": 64,
    "head_dim": 16,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_k": 2,
    "moe_topk": 2,
    "top_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 12,
    "max_position_embeddings": 512,
    "n_positions": 512,
    "n_ctx": 512,
    "max_seq_len": 512,
    "sliding_window": 9,
    "window_size": 9,
    "first_k_dense_replace": 1,
}
_FILL_NONE = ("head_dim", "num_key_value_heads", "num_experts_per_tok", "n_routed_experts")
_TOKEN_IDS = {"pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}


@dataclasses.dataclass
class Outcome:
    model_type: str
    status: str  # identical | refused | skipped | different | crashed
    reason: str = ""


def causal_lm_types() -> list[str]:
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "layer_types")


#: any other large integer field whose name says it is a width is shrunk too (not positions, windows, ids)
_WIDTH = re.compile(r"(size|dim|vocab|ffn|hidden|intermediate|rank)")
_NOT_WIDTH = re.compile(r"(position|window|token|length|chunk|max_|theta|sampling|patch|image|block)")


def _overrides(fields: dict, keep_layers: bool) -> dict:
    overrides = {
        k: (VOCAB if "vocab" in k else 64)
        for k, v in fields.items()
        if type(v) is int and v > 256 and _WIDTH.search(k) and not _NOT_WIDTH.search(k)
    }
    overrides.update({k: v for k, v in _SMALL_INTS.items() if isinstance(fields.get(k), int)})
    # sizes some configs leave None and their modules need
    overrides.update({k: _SMALL_INTS[k] for k in _FILL_NONE if k in fields and fields[k] is None})
    overrides.update({k: v for k, v in _TOKEN_IDS.items() if k in fields})
    if fields.get("num_key_value_heads") is not None and fields.get("num_key_value_heads") == fields.get(
        "num_attention_heads"
    ):  # no grouped-query attention (MLA among others): keep it that way
        overrides["num_key_value_heads"] = overrides["num_attention_heads"]
    if "qk_rope_head_dim" in overrides and "head_dim" in fields:  # MLA: the rotary part is the "head_dim"
        overrides["head_dim"] = overrides["qk_rope_head_dim"]
    if isinstance(fields.get("layer_types"), list) and not keep_layers:
        kinds = list(dict.fromkeys(fields["layer_types"]))  # keep every kind the default mixes
        layers = max(overrides.get("num_hidden_layers", len(fields["layer_types"])), len(kinds))
        overrides["layer_types"] = [kinds[i % len(kinds)] for i in range(layers)]
        if "num_hidden_layers" in fields:
            overrides["num_hidden_layers"] = layers
    if keep_layers:
        for name in _LAYER_COUNTS:
            overrides.pop(name, None)
    if "is_decoder" in fields:  # BERT-style models generate causally only as decoders
        overrides["is_decoder"] = True
    if "tie_word_embeddings" in fields:
        overrides["tie_word_embeddings"] = False
    return overrides


def _shrunk(fields: dict, keep_layers: bool) -> dict:
    """``fields`` with size fields shrunk, recursing into sub-configs (``text_config``, ``vision_config``, ...)."""
    out = {**fields, **_overrides(fields, keep_layers)}
    for name, value in fields.items():
        if isinstance(value, dict) and ("model_type" in value or name.endswith("_config")):
            out[name] = _shrunk(value, keep_layers)
    return out


def tiny_config(model_type: str, keep_layers: bool = False, only_overrides: bool = False):
    """A tiny config of ``model_type``: the class defaults with size fields shrunk (``keep_layers``: keep the
    default layer structure, for configs with per-layer lists of fixed length; ``only_overrides``: pass only the
    shrunk fields, for configs that do not survive a ``to_dict`` round trip)."""
    config_cls = type(AutoConfig.for_model(model_type))
    fields = config_cls().to_dict()
    if not only_overrides:
        return config_cls(**_shrunk(fields, keep_layers))
    kwargs = _overrides(fields, keep_layers)
    for name, value in fields.items():
        if isinstance(value, dict) and ("model_type" in value or name.endswith("_config")):
            kwargs[name] = _shrunk(value, keep_layers)
    return config_cls(**kwargs)


def _instantiate(
    model_type: str, keep_layers: bool, seed: int, only_overrides: bool = False
) -> torch.nn.Module:
    config = tiny_config(model_type, keep_layers, only_overrides)
    with torch.device("meta"):  # size check first: some defaults stay large (byte-hash vocabularies)
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > MAX_PARAMS:
        raise ValueError(f"the shrunk config still has {size / 1e6:.0f}M parameters")
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def build_model(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A tiny float32 random model of ``model_type`` in eval mode."""
    try:
        return _instantiate(model_type, keep_layers=False, seed=seed)
    except Exception:  # noqa: BLE001 - a shrunk layer count the config or a module refuses: default structure
        pass
    try:
        return _instantiate(model_type, keep_layers=True, seed=seed)
    except Exception:  # noqa: BLE001 - a config that does not survive its own to_dict: shrunk fields only
        return _instantiate(model_type, keep_layers=False, seed=seed, only_overrides=True)


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[2, 12]`` ids and mask; the second row repeats itself so prompt lookup finds drafts."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 12), generator=gen)
    ids[1, 7:] = ids[1, 2:7]
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ids[mask == 0] = PAD
    return ids, mask


def survey(model_type: str) -> Outcome:
    """Run one architecture; never raises."""
    try:
        model = build_model(model_type)
    except Exception as e:  # noqa: BLE001 - a config that cannot be built offline is a skip, with its reason
        return Outcome(
            model_type, "skipped", f"tiny model not buildable: {type(e).__name__}: {_first_line(e)}"
        )
    ids, mask = prompts()
    common = dict(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD
    )
    outputs = {}
    for strategy in STRATEGIES:  # ours first: a refusal comes before generating, whether plain generate works
        try:
            with torch.no_grad():
                outputs[strategy] = model.generate(
                    **common, custom_generate=hsv.generate, speculation=STRATEGIES[strategy]
                )
        except NotImplementedError as e:
            return Outcome(model_type, "refused", _first_line(e))
        except Exception as e:  # noqa: BLE001
            tb = traceback.extract_tb(e.__traceback__)[-1]
            where = f"{tb.filename.rsplit('/', 2)[-1]}:{tb.lineno}"
            failure = f"{strategy}: {type(e).__name__}: {_first_line(e)} ({where})"
            outputs[strategy] = failure
    try:
        with torch.no_grad():
            expected = model.generate(**common)
    except Exception as e:  # noqa: BLE001
        return Outcome(model_type, "skipped", f"plain generate fails: {type(e).__name__}: {_first_line(e)}")
    for strategy, out in outputs.items():
        if isinstance(out, str):
            return Outcome(model_type, "crashed", out)
        if not torch.equal(out, expected):
            return Outcome(model_type, "different", strategy)
    return Outcome(model_type, "identical")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
