"""`ExpertSkips`: the verify-step slot of expert skipping alone (lossy sparse verification of MoE layers; the rules
and their reference are `hf_sparse_verify.kernels.expert_skip.naive`, the calibration that measures their damage
`hf_sparse_verify.drivers.moe_damage`)."""

from __future__ import annotations

import torch  # noqa: F401 - used by the doctest

from ..step.slots import MoESkip, VerifySparsity


class ExpertSkips(VerifySparsity):
    """A `VerifySparsity` that only skips experts: ``skips[layer]`` for the layers it names, dense elsewhere (used by
    `measure_damage`; the verify loop's own slot answers `moe_skip` the same way).

    Example:
        >>> s = ExpertSkips({1: MoESkip("budget", 1, torch.tensor(0.9))})
        >>> s.moe_skip(0) is None, s.moe_skip(1).rule
        (True, 'budget')
    """

    def __init__(self, skips: dict[int, MoESkip]):
        self.skips = dict(skips)

    def moe_skip(self, layer: int) -> MoESkip | None:
        return self.skips.get(layer)
