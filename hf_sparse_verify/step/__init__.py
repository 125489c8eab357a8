"""The step spine: one typed `StepContext` per forward of the decoding loop, reachable by every module that takes
part in it (the ``"sparse_verify"`` attention, the cache, replaced MLP / experts modules) through
:func:`current_step`, with one slot per feature, each owned by one component (`slots`)."""

from .context import DeviceView, Phase, StepContext, current_step, step_scope
from .slots import KVSelection, LayerStack, MoESkip, ScoreCollection, VerifySparsity

__all__ = [
    "DeviceView",
    "KVSelection",
    "LayerStack",
    "MoESkip",
    "Phase",
    "ScoreCollection",
    "StepContext",
    "VerifySparsity",
    "current_step",
    "step_scope",
]
