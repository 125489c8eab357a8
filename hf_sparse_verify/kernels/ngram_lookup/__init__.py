"""Prompt lookup's n-gram search for a whole batch on the device (`ngram_lookup`), one launch per step."""

from .naive import ngram_lookup_naive
from .op import ngram_lookup

__all__ = ["ngram_lookup", "ngram_lookup_naive"]
