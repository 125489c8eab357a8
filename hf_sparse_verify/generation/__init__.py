"""The decoding loop, verification, drafters, K policies and the ``custom_generate`` entry points."""

from .generate import SpeculativeDecoderOnlyOutput, generate, generate_from_arguments
from .k_policy import ConstantKPolicy, HeuristicKPolicy, KPolicy, StepOutcome
from .stats import SpeculationStats

__all__ = [
    "ConstantKPolicy",
    "HeuristicKPolicy",
    "KPolicy",
    "SpeculationStats",
    "SpeculativeDecoderOnlyOutput",
    "StepOutcome",
    "generate",
    "generate_from_arguments",
]
