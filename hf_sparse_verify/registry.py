"""Name-keyed registries of drafters (strategies) and K policies: the only place that lists them.

Each entry names its class as ``"module:Class"`` (imported on first use, so that configs and the command line can
validate names and print help without importing torch) with a one-line summary for ``--help`` and the docs. What a
drafter or policy can do is an attribute of its class (`hf_sparse_verify.generation.drafters.base.Drafter`), never a
list of names elsewhere. A new strategy is one module of its own plus one line here (and its test); a plain
``"module:Class"`` string is accepted as an entry too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """``target``: ``"module:Class"``; ``summary``: one line for ``--help``."""

    target: str
    summary: str = ""


DRAFTERS: dict[str, Entry | str] = {
    "prompt_lookup": Entry(
        "hf_sparse_verify.generation.drafters.prompt_lookup:PromptLookupDrafter",
        "n-gram lookup in the prompt and the output so far (no extra model)",
    ),
    "draft_model": Entry(
        "hf_sparse_verify.generation.drafters.draft_model:DraftModelDrafter",
        "a smaller model sharing the tokenizer drafts (draft_model= / --draft-model)",
    ),
    "low_bit": Entry(
        "hf_sparse_verify.generation.drafters.low_bit:LowBitDrafter",
        "a low-bit copy of the target (draft_weights int4 / int8) drafts with its own full KV cache",
    ),
    "vegas": Entry(
        "hf_sparse_verify.generation.drafters.self_spec.drafter:VegasDrafter",
        "the target drafts for itself over the cached tokens its own verify steps weighted highest",
    ),
    "streaming": Entry(
        "hf_sparse_verify.generation.drafters.self_spec.drafter:StreamingDrafter",
        "the target drafts for itself over sink tokens plus a recent window",
    ),
    "quest": Entry(
        "hf_sparse_verify.generation.drafters.self_spec.drafter:QuestDrafter",
        "the target drafts for itself over pages picked by query-aware page summaries",
    ),
}

K_POLICIES: dict[str, Entry | str] = {
    "constant": Entry(
        "hf_sparse_verify.generation.policies.k_policy:ConstantKPolicy", "K = num_draft_tokens at every step"
    ),
    "heuristic": Entry(
        "hf_sparse_verify.generation.policies.k_policy:HeuristicKPolicy",
        "transformers' rule: K + 2 after a fully accepted draft, K - 1 otherwise",
    ),
    "plain": Entry(
        "hf_sparse_verify.generation.policies.k_policy:PlainKPolicy",
        "K = 0 at every step: plain decoding through this engine (a baseline)",
    ),
    "utility": Entry(
        "hf_sparse_verify.generation.policies.utility_policy:UtilityKPolicy",
        "Cascade: measures tokens per step over step time and picks K, or switches speculation off",
    ),
}


def summary(table: dict[str, Entry | str], name: str) -> str:
    entry = table[name]
    return entry.summary if isinstance(entry, Entry) else ""


def resolve(table: dict[str, Entry | str], name: str):
    """Import and return the class registered under ``name`` in ``table``."""
    if name not in table:
        raise ValueError(f"unknown name {name!r}; registered: {sorted(table)}")
    entry = table[name]
    module_name, attribute = (entry.target if isinstance(entry, Entry) else entry).split(":")
    return getattr(importlib.import_module(module_name), attribute)
