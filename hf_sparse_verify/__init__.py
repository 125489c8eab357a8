"""hf_sparse_verify: speculative decoding inside Hugging Face ``model.generate()``.

>>> import hf_sparse_verify
>>> out = model.generate(**inputs, custom_generate=hf_sparse_verify.generate,
...                      speculation={"strategy": "prompt_lookup", "num_draft_tokens": 4})
"""

from __future__ import annotations

import os

from ._compat import check_transformers_version
from ._version import __version__
from .config import SpeculationConfig
from .generation import (
    SpeculationStats,
    SpeculativeDecoderOnlyOutput,
    clear_graph_cache,
    generate,
    generate_from_arguments,
    set_graph_cache_size,
)

check_transformers_version()



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
    "set_graph_cache_size",
]
