"""`SparseVerifyState`: the `VerifySparsity` step slot of LOSSY sparse verification, built once per session from
the settings (`LossySparseVerify`) and the model's calibration (`SparseCalibration`).

Its tensors (block summaries, FFN thresholds, expert threshold maps) are fixed for the life of the session, so the
verify graphs captured with the slot stay valid across calls; the mean keys are rebuilt after every prefill.
"""

from __future__ import annotations

import torch

from ..step import MoESkip, VerifySparsity
from .attention import BlockSparseVerifyAttention
from .calibration import SparseCalibration
from .config import LossySparseVerify


class SparseVerifyState(VerifySparsity):
    """What a verify step may skip.

    Args:
        cfg: the settings.
        num_layers: decoder layers of the target.
        calibration: the model's calibration (needed where `LossySparseVerify.needs_calibration`).
        devices: the device of each layer (accelerate device maps: thresholds live beside their layer).
        record: calibration mode of the attention part (selections recorded, steps run dense).
    """

    def __init__(
        self,
        cfg: LossySparseVerify,
        num_layers: int,
        calibration: SparseCalibration | None,
        devices: list[torch.device],
        record: bool = False,
    ):
        if cfg.needs_calibration() and calibration is None:
            raise ValueError(
                "these lossy_sparse_verify settings need a calibration (attention.reuse, ffn without tau, or moe "
                "thresholds): run `hf-sparse-verify calibrate --model <folder> --prompt-file <prompts.jsonl>` and "
                "pass lossy_sparse_verify.calibration=<folder>, or give ffn.tau / moe.budget and reuse=False"
            )
        self.cfg = cfg
        self.attention = None
        if cfg.attention is not None:
            anchors = calibration.anchor_layers(cfg.attention) if cfg.attention.reuse else None
            self.attention = BlockSparseVerifyAttention(cfg.attention, num_layers, anchors, record=record)
        self._ffn: dict[int, torch.Tensor] = {}
        if cfg.ffn is not None:
            taus = (
                [cfg.ffn.tau] * num_layers if cfg.ffn.tau is not None else calibration.ffn_thresholds(cfg.ffn)
            )
            self._ffn = {
                i: torch.tensor(float(t), device=devices[i]) for i, t in enumerate(taus) if t is not None
            }
        self._moe: dict[int, MoESkip] = {}
        if cfg.moe is not None:
            for layer, (rule, values) in calibration_or_budget(cfg, calibration, num_layers).items():
                self._moe[layer] = MoESkip(
                    rule, cfg.moe.max_skip, torch.tensor(values, dtype=torch.float32, device=devices[layer])
                )

    def prefill(self, cache, pad: torch.Tensor, length: torch.Tensor) -> None:
        """After the prefill: summarise the prompt's keys for block selection."""
        if self.attention is not None:
            self.attention.build(cache, pad, length)

    def drafted(self, counts: torch.Tensor) -> None:
        if self.attention is not None:
            self.attention.drafted(counts)

    def attend(self, module, query, key, value, view, scaling):
        if self.attention is None:
            return None
        return self.attention.attend(module, query, key, value, view, scaling)

    def ffn_tau(self, layer: int) -> torch.Tensor | None:
        return self._ffn.get(layer)

    def moe_skip(self, layer: int) -> MoESkip | None:
        return self._moe.get(layer)


def calibration_or_budget(
    cfg: LossySparseVerify, calibration: SparseCalibration | None, num_layers: int
) -> dict[int, tuple[str, list[float] | float]]:
    """MoE layer -> (rule, values) for `MoESkip`: a fixed budget or row expert count from the settings, else the
    calibration's maps."""
    moe = cfg.moe
    fixed = {"row_union": moe.row_experts, "budget": moe.budget}.get(moe.rule)
    if fixed is not None:  # one value for every MoE layer, no calibration needed
        if calibration is not None and calibration.moe_layers:
            if moe.rule == "row_union":  # where the calibration measured this setting, its damage bound holds
                calibration.check_moe_damage(moe)
            layers = calibration.moe_layers
        else:
            layers = list(range(num_layers))
        return {layer: (moe.rule, float(fixed)) for layer in layers}
    return calibration.moe_rules(moe)
