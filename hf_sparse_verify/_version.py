"""The package version and the transformers releases it supports (the bottom layer: no package imports, no torch)."""

from __future__ import annotations

from importlib.metadata import version

from packaging.version import Version

__version__ = "0.1.0"

TRANSFORMERS_MIN = Version("5.17.0")
TRANSFORMERS_MAX = Version("6.0.0")


def check_transformers_version() -> None:
    """Raise ImportError when the installed transformers is outside [`TRANSFORMERS_MIN`, `TRANSFORMERS_MAX`)."""
    current = Version(version("transformers"))
    if not TRANSFORMERS_MIN <= current < TRANSFORMERS_MAX:
        raise ImportError(
            f"hf_sparse_verify needs transformers >= {TRANSFORMERS_MIN}, < {TRANSFORMERS_MAX}; found {current}"
        )
