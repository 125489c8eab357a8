"""Prompt lookup's n-gram search for a whole batch on the device (`ngram_lookup`; `NgramLookup` for a decode
loop), one launch per step."""

from .naive import ngram_lookup_naive
from .op import NgramLookup, ngram_lookup

__all__ = ["NgramLookup", "ngram_lookup", "ngram_lookup_naive"]
