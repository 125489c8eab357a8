"""Name-keyed registries of drafters (strategies) and K policies.

Entries are ``"module:attribute"`` strings so that the config can validate names without importing torch-heavy
modules; :func:`resolve` imports on first use. Later strategies add one line here and one module of their own.
"""

from __future__ import annotations

import importlib

DRAFTERS: dict[str, str] = {
    "prompt_lookup": "hf_sparse_verify.generation.drafters.prompt_lookup:PromptLookupDrafter",
    "draft_model": "hf_sparse_verify.generation.drafters.draft_model:DraftModelDrafter",
    "vegas": "hf_sparse_verify.generation.drafters.self_spec.drafter:VegasDrafter",
    "streaming": "hf_sparse_verify.generation.drafters.self_spec.drafter:StreamingDrafter",
    "quest": "hf_sparse_verify.generation.drafters.self_spec.drafter:QuestDrafter",
}

K_POLICIES: dict[str, str] = {
    "constant": "hf_sparse_verify.generation.policies.k_policy:ConstantKPolicy",
    "heuristic": "hf_sparse_verify.generation.policies.k_policy:HeuristicKPolicy",
    "plain": "hf_sparse_verify.generation.policies.k_policy:PlainKPolicy",
    "utility": "hf_sparse_verify.generation.policies.utility_policy:UtilityKPolicy",
}


def resolve(table: dict[str, str], name: str):
    """Import and return the object registered under ``name`` in ``table``."""
    if name not in table:
        raise ValueError(f"unknown name {name!r}; registered: {sorted(table)}")
    module_name, attribute = table[name].split(":")
    return getattr(importlib.import_module(module_name), attribute)
