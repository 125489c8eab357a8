"""Every touch of transformers internals lives here, with the versions it was checked against.

- transformers drops ``streamer`` (and ``tokenizer``) before calling a ``custom_generate`` *callable*
  (`GenerationMixin._extract_generation_mode_kwargs` rebuilds the mode kwargs from the callable's own
  parameters). The prompt has already been streamed by then, so we read the streamer back from the ``generate``
  frame that called us. Checked on 5.17.0 and 5.23.0.
- ``assistant_model`` is dropped the same way (it is a named parameter of ``generate``, never part of the kwargs a
  callable receives); we read it back from that frame too and use it as the draft model. Checked on 5.17.0.
- Architectures are matched by ``config.model_type``: the attention modules of these families call
  ``past_key_values.update`` and the registered attention function with the standard signature.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import transformers
from packaging.version import Version
from transformers.generation.utils import GenerationMixin

TRANSFORMERS_MIN = Version("5.17.0")
TRANSFORMERS_MAX = Version("6.0.0")

#: model types whose attention goes through `AttentionInterface` and a standard KV cache, tested in CI
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "mistral": "Mistral (sliding window)",
    "qwen3_moe": "Qwen3-MoE",
    "mixtral": "Mixtral",
    "olmoe": "OLMoE",
    "qwen2_moe": "Qwen2-MoE (shared expert)",
}

#: model types known not to work, with what is missing
UNSUPPORTED_MODEL_TYPES: dict[str, str] = {
    "gemma2": "attention logit soft-capping",
    "gemma3": "attention logit soft-capping and per-layer rotary bases",
    "gpt_oss": "attention sinks",
    "mamba": "a recurrent state instead of a KV cache",
    "mamba2": "a recurrent state instead of a KV cache",
    "jamba": "recurrent (Mamba) layers",
    "falcon_h1": "recurrent (Mamba) layers",
    "qwen3_next": "linear-attention layers with a recurrent state",
    "deepseek_v3": "multi-head latent attention (compressed KV)",
    "t5": "an encoder-decoder architecture",
    "bart": "an encoder-decoder architecture",
}


def check_transformers_version() -> None:
    current = Version(version("transformers"))
    if not TRANSFORMERS_MIN <= current < TRANSFORMERS_MAX:
        raise ImportError(
            f"hf_sparse_verify needs transformers >= {TRANSFORMERS_MIN}, < {TRANSFORMERS_MAX}; found {current}"
        )


def check_architecture(model) -> None:
    """Raise a clear error for architectures the engine does not support."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        raise NotImplementedError(
            f"{type(model).__name__} is an encoder-decoder model; hf_sparse_verify supports decoder-only causal LMs"
        )
    model_type = config.get_text_config().model_type
    if model_type in SUPPORTED_MODEL_TYPES:
        return
    supported = ", ".join(SUPPORTED_MODEL_TYPES.values())
    if model_type in UNSUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"model type {model_type!r} is not supported: it needs {UNSUPPORTED_MODEL_TYPES[model_type]}, which the "
            f"'sparse_verify' attention and cache do not implement. Supported: {supported}"
        )
    raise NotImplementedError(
        f"model type {model_type!r} has not been validated with hf_sparse_verify (its attention must use "
        f"transformers' AttentionInterface and a standard KV cache, and be tested for lossless output). "
        f"Supported: {supported}"
    )


def _generate_argument(name: str):
    """The argument ``name`` of the innermost `GenerationMixin.generate` call that is running us, if any."""
    target = GenerationMixin.generate
    code = getattr(target, "__wrapped__", target).__code__
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
    "SUPPORTED_MODEL_TYPES",
    "UNSUPPORTED_MODEL_TYPES",
    "check_architecture",
    "check_transformers_version",
    "recover_assistant_model",
    "recover_streamer",
    "transformers",
]
