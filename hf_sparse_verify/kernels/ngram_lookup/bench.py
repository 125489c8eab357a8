"""Benchmark entry ``ngram_lookup``: prompt lookup's search at 16 x 16K, 32 x 8K and 1 x 16K tokens (n-grams 3..1,
K = 4), ``triton`` (this folder's kernel through a prepared `NgramLookup`: one launch, outputs and scratch kept) vs
``torch`` (the reference's ~45 launches). ``bytes_moved``: each row's history read once per n-gram size, the
drafts written. ``benchmarks/bench_ngram_lookup.py`` measures what a decode step pays for it."""

from __future__ import annotations

import functools

import torch

from ..bench_registry import KernelCase, register_benchmark
from .naive import ngram_lookup_naive
from .op import NgramLookup


@register_benchmark("ngram_lookup")
def cases(device: torch.device, dtype: torch.dtype, quick: bool):
    shapes = ((4, 1024),) if quick else ((16, 16384), (32, 8192), (1, 16384))
    for batch, context in shapes:
        gen = torch.Generator(device="cpu").manual_seed(0)
        tokens = torch.randint(0, 32000, (batch, context + 64), generator=gen).to(device)
        committed = torch.full((batch,), context, dtype=torch.long, device=device)
        pad = torch.zeros(batch, dtype=torch.long, device=device)
        active = torch.ones(batch, dtype=torch.bool, device=device)
        search = NgramLookup(batch, context + 64, 4, 3, 1, device, kernel=True)
        search.check(tokens, committed, pad, active)
        moved = 3 * batch * context * tokens.element_size() + batch * 4 * 8
        params = dict(batch=batch, context=context, num_tokens=4, max_ngram=3)
        yield KernelCase(
            "ngram_lookup", "triton", params, moved, functools.partial(search, tokens, committed, pad, active)
        )
        args = (tokens, committed, pad, 4, 3, 1, active)
        yield KernelCase("ngram_lookup", "torch", params, moved, functools.partial(ngram_lookup_naive, *args))
