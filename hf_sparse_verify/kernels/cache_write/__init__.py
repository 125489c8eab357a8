"""Write a step's keys and values into the preallocated cache in one launch."""

from .naive import cache_write_naive
from .op import cache_write

__all__ = ["cache_write", "cache_write_naive"]
