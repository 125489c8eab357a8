"""The decoding loop, verification, drafters, K policies and the ``custom_generate`` entry points."""

from .engine.sessions import clear_graph_cache, set_graph_cache_size
from .engine.stats import SpeculationStats
from .generate import SpeculativeDecoderOnlyOutput, generate, generate_from_arguments
from .policies.k_policy import ConstantKPolicy, HeuristicKPolicy, KPolicy, StepOutcome
from .profiles import save_profile

__all__ = [
    "ConstantKPolicy",
    "HeuristicKPolicy",
    "KPolicy",
    "SpeculationStats",
    "SpeculativeDecoderOnlyOutput",
    "StepOutcome",
    "clear_graph_cache",
    "generate",
    "generate_from_arguments",
    "save_profile",
    "set_graph_cache_size",
]
