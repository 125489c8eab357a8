"""hf_sparse_verify: speculative decoding inside Hugging Face ``model.generate()``.

>>> import hf_sparse_verify
>>> out = model.generate(**inputs, custom_generate=hf_sparse_verify.generate,
...                      speculation={"strategy": "prompt_lookup", "num_draft_tokens": 4})

The public names load on first use (PEP 562), so ``import hf_sparse_verify`` and the command line's ``--help`` do
not pay for torch and transformers until they are needed.
"""

from __future__ import annotations

import importlib
import os

from ._version import __version__, check_transformers_version

check_transformers_version()

#: public name -> the module that defines it
_LAZY = {
    "SpeculationConfig": "hf_sparse_verify.config",
    "SpeculationStats": "hf_sparse_verify.generation",
    "SpeculativeDecoderOnlyOutput": "hf_sparse_verify.generation",
    "clear_graph_cache": "hf_sparse_verify.generation",
    "generate": "hf_sparse_verify.generation",
    "generate_from_arguments": "hf_sparse_verify.generation",
    "save_profile": "hf_sparse_verify.generation",
    "set_graph_cache_size": "hf_sparse_verify.generation",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hf_sparse_verify' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def custom_generate_path() -> str:
    """Folder usable as ``model.generate(..., custom_generate=<folder>, trust_remote_code=True)``; it holds
    ``custom_generate/generate.py`` (which only delegates to this package), the layout to publish on the Hub next
    to a model."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "hub")


def default_model_path() -> str:
    """Folder of the embedded demo pair (``target/`` and ``draft/``) that the CLI runs without ``--model``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_model")


__all__ = [
    "SpeculationConfig",
    "SpeculationStats",
    "SpeculativeDecoderOnlyOutput",
    "__version__",
    "clear_graph_cache",
    "custom_generate_path",
    "default_model_path",
    "generate",
    "generate_from_arguments",
    "save_profile",
    "set_graph_cache_size",
]
