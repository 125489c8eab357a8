"""Survey of every causal LM in transformers' registry: a tiny random model per ``model_type``, plain greedy
``generate`` against ``hf_sparse_verify`` (prompt_lookup and vegas), float32, a left-padded batch of 2.

Each tiny model is built from transformers' own model-tester config when a copy of transformers' ``tests`` folder is
given (``tester_config``; those configs switch on each model's distinctive parts), else from the class defaults with
size fields shrunk (``tiny_config``); every outcome records which (``tester`` or ``default``).

Each architecture ends in one of: ``identical`` (every strategy token-identical), ``refused`` (our call raised
`NotImplementedError` before generating; the reason is kept), ``skipped`` (no tiny model could be built offline,
or plain ``generate`` itself fails), ``different`` or ``crashed`` (bugs: the test fails on them). Used by
``tests/test_architectures.py`` and ``scripts/supported_models.py``.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import traceback
import types
import unittest
from pathlib import Path

import torch
from conftest import noisy_copy
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import hf_sparse_verify as hsv

VOCAB = 96
PAD, EOS, BOS = 0, 1, 2
#: vegas drafts from a real selection (30% of the prefix, at least 4 slots), so sparse draft steps run too
#: draft_model drafts with a noisy copy of the model (`conftest.noisy_copy`), so drafts are rejected part-way; a model
#: that refuses self-speculation (vegas) with a reason, after the others ran identical, counts as identical
STRATEGIES = {
    "prompt_lookup": dict(strategy="prompt_lookup", num_draft_tokens=3),
    "draft_model": dict(strategy="draft_model", num_draft_tokens=3),
    "vegas": dict(strategy="vegas", num_draft_tokens=3, ratio=0.3, min_tokens=4),
}
SELF_SPECULATIVE = ("vegas",)
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
#: fields whose class defaults leave a tiny model without any attention layer (the attention layers sit at a
#: period or offset past the shrunk layer count, or are none by default), so plain ``generate`` fails on it; set as
#: transformers' model testers do, one recurrent and one attention layer
_HYBRID_LAYOUT = {
    "jamba": {
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
    },
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    # Zamba's shared attention reads the hidden state beside the embeddings: twice the hidden width
    "zamba": {
        "layers_block_type": ["linear_attention", "hybrid"],
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "head_dim": 32,
    },
    "zamba2": {
        "layers_block_type": ["linear_attention", "hybrid"],
        "attention_hidden_size": 128,
        "attention_head_dim": 32,
        "head_dim": 32,
        "kv_channels": 32,
        "mamba_headdim": 16,
        "hybrid_layer_ids": [1],
    },
}
_FILL_NONE = ("head_dim", "num_key_value_heads", "num_experts_per_tok", "n_routed_experts")
_TOKEN_IDS = {"pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS}


@dataclasses.dataclass
class Outcome:
    model_type: str
    status: str  # identical | refused | skipped | different | crashed
    reason: str = ""
    config: str = "default"  # tester (transformers' model-tester config) | default (shrunk class defaults)
    config_note: str = ""  # why a tester config was not used, when a tests folder was given


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
        # Gemma 3n / 4: the last layers read the first ones' KV (switched on); where every layer reads another
        # model's KV (a Gemma 4 assistant), still all of them
        if fields.get("num_kv_shared_layers", 0) >= len(fields["layer_types"]):
            overrides["num_kv_shared_layers"] = layers
        elif "num_kv_shared_layers" in fields:
            layers = 2 * len(kinds)
            overrides["num_kv_shared_layers"] = len(kinds)
        overrides["layer_types"] = [kinds[i % len(kinds)] for i in range(layers)]
        if isinstance(
            fields.get("per_layer_config"), dict
        ):  # Gemma 4: {"05": {...}}, its full-attention layers
            overrides["per_layer_config"] = _per_layer(fields, overrides["layer_types"])
        if "num_hidden_layers" in fields:
            overrides["num_hidden_layers"] = layers
    layers = fields.get("num_hidden_layers")
    if (
        isinstance(layers, int) and not keep_layers
    ):  # per-layer lists (Gemma 3n's widths, sparsity): kept layers'
        kept = overrides.get("num_hidden_layers", layers)
        for name, value in fields.items():
            if isinstance(value, list) and len(value) == layers and name != "layer_types":
                overrides[name] = [64] * kept if name == "intermediate_size" else value[:kept]
    if keep_layers:
        for name in _LAYER_COUNTS:
            overrides.pop(name, None)
    if "is_decoder" in fields:  # BERT-style models generate causally only as decoders
        overrides["is_decoder"] = True
    if "tie_word_embeddings" in fields:
        overrides["tie_word_embeddings"] = False
    return overrides


def _per_layer(fields: dict, layer_types: list[str]) -> dict:
    """A config's per-layer overrides (keyed by layer index) moved onto the shrunk ``layer_types``: each kept layer
    takes the (shrunk) override of the first original layer of its kind that has one."""
    by_kind = {}
    for key, value in sorted(fields["per_layer_config"].items()):
        by_kind.setdefault(fields["layer_types"][int(key)], {**value, **_overrides(value, keep_layers=True)})
    width = len(next(iter(fields["per_layer_config"])))
    return {f"{i:0{width}d}": by_kind[kind] for i, kind in enumerate(layer_types) if kind in by_kind}


def _shrunk(fields: dict, keep_layers: bool) -> dict:
    """``fields`` with size fields shrunk, recursing into sub-configs (``text_config``, ``vision_config``, ...)."""
    overrides = _overrides(fields, keep_layers)
    out = {**fields, **overrides}
    for name, value in fields.items():
        if (
            isinstance(value, dict)
            and ("model_type" in value or name.endswith("_config"))
            and name not in overrides
        ):
            out[name] = _shrunk(value, keep_layers)
    return out


def tiny_config(model_type: str, keep_layers: bool = False, only_overrides: bool = False):
    """A tiny config of ``model_type``: the class defaults with size fields shrunk (``keep_layers``: keep the
    default layer structure, for configs with per-layer lists of fixed length; ``only_overrides``: pass only the
    shrunk fields, for configs that do not survive a ``to_dict`` round trip)."""
    config_cls = type(AutoConfig.for_model(model_type))
    fields = config_cls().to_dict()
    layout = _HYBRID_LAYOUT.get(model_type, {})
    if not only_overrides:
        return config_cls(**{**_shrunk(fields, keep_layers), **layout})
    kwargs = {**_overrides(fields, keep_layers), **layout}
    for name, value in fields.items():
        if (
            isinstance(value, dict)
            and ("model_type" in value or name.endswith("_config"))
            and name not in kwargs
        ):
            kwargs[name] = _shrunk(value, keep_layers)
    return config_cls(**kwargs)


def _from_config(config: PreTrainedConfig, seed: int) -> torch.nn.Module:
    with torch.device("meta"):  # size check first: some defaults stay large (byte-hash vocabularies)
        size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    if size > MAX_PARAMS:
        raise ValueError(f"the config still has {size / 1e6:.0f}M parameters")
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _instantiate(
    model_type: str, keep_layers: bool, seed: int, only_overrides: bool = False
) -> torch.nn.Module:
    return _from_config(tiny_config(model_type, keep_layers, only_overrides), seed)


def _default_model(model_type: str, seed: int) -> torch.nn.Module:
    try:
        return _instantiate(model_type, keep_layers=False, seed=seed)
    except Exception:  # noqa: BLE001 - a shrunk layer count the config or a module refuses: default structure
        pass
    try:
        return _instantiate(model_type, keep_layers=True, seed=seed)
    except Exception:  # noqa: BLE001 - a config that does not survive its own to_dict: shrunk fields only
        return _instantiate(model_type, keep_layers=False, seed=seed, only_overrides=True)


def build(model_type: str, seed: int = 0, tests_dir: Path | None = None) -> tuple[torch.nn.Module, str, str]:
    """A tiny float32 random model of ``model_type`` in eval mode, the config it came from (``tester`` or
    ``default``), and why no tester config was used (empty when one was, or when ``tests_dir`` is None)."""
    note = ""
    if tests_dir is not None:
        config, note = _tester_config(model_type, tests_folder(tests_dir))
        if config is not None:
            try:
                return _from_config(_with_survey_ids(config), seed), "tester", ""
            except Exception as e:  # noqa: BLE001 - a tester config we cannot build: the shrunk defaults
                note = f"tester config not buildable: {type(e).__name__}: {_first_line(e)}"
    return _default_model(model_type, seed), "default", note


def build_model(model_type: str, seed: int = 0, tests_dir: Path | None = None) -> torch.nn.Module:
    """A tiny float32 random model of ``model_type`` in eval mode (see ``build``)."""
    return build(model_type, seed, tests_dir)[0]


# ------------------------------------------------------------------------------- transformers' tester configs
#: the import name each transformers ``tests`` folder is loaded under (not ``tests``: that name is ours)
_TEST_PACKAGES: dict[Path, str] = {}


def tests_folder(path: Path) -> Path:
    """transformers' ``tests`` folder at ``path``: the folder itself, or the source tree that holds it."""
    path = Path(path).resolve()
    return path / "tests" if (path / "tests" / "models").is_dir() else path


def _import_test_module(tests_dir: Path, folder: str) -> types.ModuleType:
    """``tests/models/<folder>/test_modeling_<folder>.py`` of ``tests_dir``, imported as a submodule of a package
    rooted at ``tests_dir`` so its relative imports (``...test_modeling_common``) resolve."""
    if tests_dir not in _TEST_PACKAGES:
        name = f"_transformers_tests_{len(_TEST_PACKAGES)}"
        package = types.ModuleType(name)
        package.__path__ = [str(tests_dir)]
        sys.modules[name] = package
        _TEST_PACKAGES[tests_dir] = name
    return importlib.import_module(f"{_TEST_PACKAGES[tests_dir]}.models.{folder}.test_modeling_{folder}")


def _tester_classes(module: types.ModuleType, causal_lm_class: str) -> list[type]:
    """The ``*ModelTester`` classes defined in ``module``: the one named after the model first, then its text
    tester (composite models), then the rest in file order."""
    prefix = causal_lm_class.split("For")[0]
    testers = [
        cls
        for name, cls in vars(module).items()
        if isinstance(cls, type) and name.endswith("ModelTester") and cls.__module__ == module.__name__
    ]
    preferred = (f"{prefix}ModelTester", f"{prefix}TextModelTester")

    def rank(cls: type) -> int:
        return preferred.index(cls.__name__) if cls.__name__ in preferred else len(preferred)

    return sorted(testers, key=rank)  # stable: file order among the rest


def _config_of(tester_cls: type) -> PreTrainedConfig | None:
    """The config a tester builds: ``get_config()``, else the config among ``prepare_config_and_inputs*()``."""
    tester = tester_cls(unittest.TestCase())  # testers call parent.assertEqual and friends
    if hasattr(tester, "get_config"):
        try:
            return tester.get_config()
        except Exception:  # noqa: BLE001 - some get_config need fields set by prepare_config_and_inputs
            pass
    for method in ("prepare_config_and_inputs_for_common", "prepare_config_and_inputs"):
        if hasattr(tester, method):
            configs = [x for x in getattr(tester, method)() if isinstance(x, PreTrainedConfig)]
            if configs:
                return configs[0]
    return None


def _tester_config(model_type: str, tests_dir: Path) -> tuple[PreTrainedConfig | None, str]:
    folder = type(AutoConfig.for_model(model_type)).__module__.split(".")[2]  # transformers.models.<folder>
    if not (tests_dir / "models" / folder / f"test_modeling_{folder}.py").is_file():
        return None, f"no tests/models/{folder}/test_modeling_{folder}.py"
    try:
        module = _import_test_module(tests_dir, folder)
    except Exception as e:  # noqa: BLE001 - a test module that needs what we lack (a backend, a test helper)
        return None, f"test module import failed: {type(e).__name__}: {_first_line(e)}"
    errors = []
    for tester_cls in _tester_classes(module, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]):
        try:
            config = _config_of(tester_cls)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{tester_cls.__name__}: {type(e).__name__}: {_first_line(e)}")
            continue
        if config is not None and config.model_type == model_type:
            return config, ""
    return None, "; ".join(errors) or f"no tester in test_modeling_{folder}.py builds a '{model_type}' config"


def tester_config(model_type: str, tests_dir: Path) -> PreTrainedConfig | None:
    """The config transformers' own test suite builds for ``model_type`` (its ``*ModelTester``'s ``get_config()``),
    from a copy of transformers' ``tests`` folder at ``tests_dir``; None where there is no such tester, its module
    does not import, or no tester builds a config of this ``model_type``.

    Example: ``tester_config("llama", Path(".carry/transformers-tests/tests"))`` -> a ``LlamaConfig`` with the
    tester's sizes (vocabulary 99, 2 layers, hidden size 32).
    """
    return _tester_config(model_type, tests_folder(tests_dir))[0]


def _with_survey_ids(config: PreTrainedConfig) -> PreTrainedConfig:
    """``config`` with the survey's special token ids and, for BERT-style models, decoder mode."""
    text_config = config.get_text_config()
    for sub in [config] if text_config is config else [config, text_config]:
        fields = sub.to_dict()
        for name, value in _TOKEN_IDS.items():
            if name in fields:
                setattr(sub, name, value)
        if "is_decoder" in fields:  # BERT-style models generate causally only as decoders
            sub.is_decoder = True
    return config


def vocab_size(model: torch.nn.Module) -> int:
    """The vocabulary the survey's prompts must stay within: the model's, at most ``VOCAB``."""
    return min(VOCAB, getattr(model.config.get_text_config(), "vocab_size", VOCAB) or VOCAB)


def prompts(vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[2, 12]`` ids in ``[3, vocab)`` and mask; the second row repeats itself so prompt lookup finds
    drafts."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, 12), generator=gen)
    ids[1, 7:] = ids[1, 2:7]
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    ids[mask == 0] = PAD
    return ids, mask


def survey(model_type: str, tests_dir: Path | None = None) -> Outcome:
    """Run one architecture (from its tester config when ``tests_dir``, transformers' ``tests`` folder, is given
    and has one); never raises."""
    try:
        model, source, note = build(model_type, tests_dir=tests_dir)
    except Exception as e:  # noqa: BLE001 - a config that cannot be built offline is a skip, with its reason
        return Outcome(
            model_type, "skipped", f"tiny model not buildable: {type(e).__name__}: {_first_line(e)}"
        )
    outcome = _compare(model_type, model)
    if outcome.status == "skipped" and _GROUPED_MM_REFUSAL in outcome.reason:
        # PyTorch's CPU grouped_mm refuses the experts' odd sizes (model testers' 37 or 12 channels): the same
        # comparison with transformers' eager experts loop, for plain generate and ours alike
        model.set_experts_implementation("eager")
        outcome = _compare(model_type, model)
        note = "; ".join(filter(None, [note, "experts on transformers' eager loop (CPU grouped_mm refuses the sizes)"]))
    return dataclasses.replace(outcome, config=source, config_note=note)


#: PyTorch's CPU ``grouped_mm`` error for operands whose rows are not 16-byte aligned
_GROUPED_MM_REFUSAL = "strides should be multiple of 16 bytes"


def _compare(model_type: str, model: torch.nn.Module) -> Outcome:
    ids, mask = prompts(vocab_size(model))
    common = dict(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=MAX_NEW, pad_token_id=PAD
    )
    outputs = {}
    note = ""
    for strategy in STRATEGIES:  # ours first: a refusal comes before generating, whether plain generate works
        extra = {"draft_model": noisy_copy(model)} if strategy == "draft_model" else {}
        try:
            with torch.no_grad():
                outputs[strategy] = model.generate(
                    **common, custom_generate=hsv.generate, speculation=STRATEGIES[strategy], **extra
                )
        except NotImplementedError as e:
            if strategy in SELF_SPECULATIVE and outputs:  # the model runs, self-speculation does not: say why
                note = f"{strategy} refused: {_first_line(e)}"
                continue
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
    return Outcome(model_type, "identical", note)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""
