"""`SparseCalibration`: what LOSSY sparse verification learns about one model from calibration prompts, saved as
JSON (``sparse_verify_calibration.json``, never pickle) next to the model and loadable from a folder, a file or the
Hub.

- attention: the mean Jaccard similarity of each layer's selected-block mask to the previous layer's (the sparse-verification paper
  Eq. 7, layer 0 scores 0), from which the anchor layers are the least similar ones (Eq. 8);
- ffn: per-layer activation thresholds for a grid of channel sparsities (`FFN_LEVELS`);
- moe: per-layer threshold maps ``beta_1 .. beta_{k-1}`` and weight budgets, with the damage each setting did;
- grades: candidate lossy settings, each with the precision class its measured quality earned (issue 40's gates,
  `hf_sparse_verify.drivers.quality.grant`) and the measures; `granted` picks the one a precision admits.

`hf_sparse_verify.drivers.calibrate.calibrate` makes one by running calibration prompts through the engine.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any

from .config import LossySparseVerify, SparseAttention, SparseFFN, SparseMoE

FILE_NAME = "sparse_verify_calibration.json"
#: precision -> the classes of graded settings it admits (stricter classes included)
GRANTS = {"near_exact": ("near_exact",), "balanced": ("near_exact", "balanced")}
#: channel sparsities the FFN thresholds are calibrated for
FFN_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))


@dataclass
class SparseCalibration:
    """Calibration of one model (see the module docstring). Lists are indexed by decoder layer."""

    model_type: str
    num_layers: int
    prompts: int = 0
    verify_tokens: int = 0
    attention: dict[str, Any] | None = None  # block_size, rho, dense_below, similarity [L]
    ffn: dict[str, Any] | None = None  # levels [n], thresholds [L][n] (None for layers without an FFN)
    # layers, k, thresholds [layers][k-1], budgets {m: [layers]}, damage {...}
    moe: dict[str, Any] | None = None
    # [{"setting": LossySparseVerify fields, "class": str, "why_not_higher": str, "measures": {...}}], sparsest first
    grades: list[dict[str, Any]] | None = None

    # ---------------------------------------------------------------------------------------------- queries
    def anchor_layers(self, cfg: SparseAttention) -> list[int]:
        """The ``cfg.anchors`` layers least similar to their predecessor (default: a quarter of the layers, at least
        one), ascending; layer 0 always comes first (its similarity is 0)."""
        if not self.attention or "similarity" not in self.attention:
            raise ValueError(
                "the calibration holds no attention similarities: recalibrate with attention enabled"
            )
        similarity = self.attention["similarity"]
        count = cfg.anchors if cfg.anchors is not None else max(1, self.num_layers // 4)
        if count > self.num_layers:
            raise ValueError(f"attention.anchors={count} exceeds the model's {self.num_layers} layers")
        ranked = sorted(range(self.num_layers), key=lambda i: (similarity[i], i))
        return sorted(ranked[:count])

    def ffn_thresholds(self, cfg: SparseFFN) -> list[float | None]:
        """Per-layer tau for ``cfg.sparsity`` (one of `FFN_LEVELS`)."""
        if not self.ffn:
            raise ValueError(
                "the calibration holds no FFN thresholds: recalibrate with --ffn, or give ffn.tau"
            )
        levels = self.ffn["levels"]
        matches = [i for i, level in enumerate(levels) if abs(level - cfg.sparsity) < 1e-6]
        if not matches:
            raise ValueError(
                f"ffn.sparsity={cfg.sparsity} was not calibrated: use one of {levels}, or give ffn.tau"
            )
        return [None if row is None else row[matches[0]] for row in self.ffn["thresholds"]]

    @property
    def moe_layers(self) -> list[int]:
        return list(self.moe["layers"]) if self.moe else []

    def check_moe_damage(self, cfg: SparseMoE) -> None:
        """Refuse ``cfg`` when this calibration measured its damage above ``cfg.max_damage``."""
        damage = (self.moe or {}).get("damage", {}).get(damage_key(cfg))
        if damage is not None and damage > cfg.max_damage:
            raise ValueError(
                f"expert skipping ({damage_key(cfg)}) raised the calibration NLL by {100 * damage:.1f}% (bound "
                f"{100 * cfg.max_damage:.1f}%): lower max_skip (or raise row_experts) or raise max_damage"
            )

    def moe_rules(self, cfg: SparseMoE) -> dict[int, tuple[str, list[float] | float]]:
        """MoE layer -> (rule, values) for `MoESkip`, refusing settings the calibration measured past
        ``cfg.max_damage``."""
        if not self.moe:
            raise ValueError(
                "the calibration holds no MoE statistics: recalibrate a MoE model, or give moe.budget"
            )
        k = self.moe["k"]
        if cfg.max_skip >= k:
            raise ValueError(
                f"moe.max_skip={cfg.max_skip} must be below the model's {k} routed experts per token"
            )
        self.check_moe_damage(cfg)
        if cfg.rule == "threshold":
            return {
                layer: ("threshold", list(row))
                for layer, row in zip(self.moe["layers"], self.moe["thresholds"])
            }
        budgets = self.moe["budgets"].get(str(cfg.max_skip))
        if budgets is None:
            raise ValueError(f"no budgets calibrated for max_skip={cfg.max_skip}")
        return {layer: ("budget", float(b)) for layer, b in zip(self.moe["layers"], budgets)}

    def granted(self, precision: str, location: str | None = None) -> LossySparseVerify | None:
        """The first graded setting (calibrate writes them sparsest first) whose class ``precision`` admits:
        ``"near_exact"`` admits ``near_exact``; ``"balanced"`` admits ``near_exact`` and ``balanced``. None where no
        grade qualifies (the call then runs exact). ``location``: this calibration's file or folder, which the
        setting then names as its ``calibration``."""
        admitted = GRANTS.get(precision)
        if admitted is None:
            raise ValueError(
                f"only precision 'near_exact' or 'balanced' takes a granted setting, got {precision!r}"
            )
        for grade in self.grades or ():
            if grade["class"] in admitted:
                return LossySparseVerify.from_dict({**grade["setting"], "calibration": location})
        return None

    def graded(self, setting: LossySparseVerify, precision: str) -> bool:
        """Whether ``setting`` (its ``calibration`` aside) is one of the grades with a class ``precision`` admits."""
        def fields(data: dict) -> dict:
            return {**LossySparseVerify.from_dict(dict(data)).to_dict(), "calibration": None}

        wanted = fields(setting.to_dict())
        admitted = GRANTS[precision]
        return any(g["class"] in admitted and fields(g["setting"]) == wanted for g in self.grades or ())

    # ------------------------------------------------------------------------------------------------- files
    def save(self, directory: str | os.PathLike) -> str:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, FILE_NAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=1)
            f.write("\n")
        return path

    @classmethod
    def load(cls, location: str | os.PathLike, **hub_kwargs) -> SparseCalibration:
        """From ``sparse_verify_calibration.json`` itself, a folder holding it, or a Hub repo holding it."""
        location = str(location)
        if os.path.isdir(location):
            location = os.path.join(location, FILE_NAME)
            if not os.path.isfile(location):
                raise OSError(
                    f"{location} not found: run `hf-sparse-verify calibrate --model <folder> --prompt-file <file>`"
                )
        elif not os.path.isfile(location):
            from huggingface_hub import hf_hub_download

            location = hf_hub_download(repo_id=location, filename=FILE_NAME, **hub_kwargs)
        with open(location, encoding="utf-8") as f:
            data = json.load(f)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def find_calibration(cfg: LossySparseVerify, model) -> SparseCalibration | None:
    """The calibration ``cfg`` names, else the one in the model's folder (None when neither exists and
    ``cfg`` does not need one). Checks it belongs to a model of the same type and depth."""
    location = cfg.calibration
    if location is None:
        folder = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "")
        if folder and os.path.isfile(os.path.join(folder, FILE_NAME)):
            location = folder
    if location is None:
        return None
    calibration = SparseCalibration.load(location)
    text = model.config.get_text_config()
    if calibration.num_layers != text.num_hidden_layers:
        raise ValueError(
            f"the calibration at {location} is for a model of {calibration.num_layers} layers, this one has "
            f"{text.num_hidden_layers}: recalibrate for this model"
        )
    return calibration


def damage_key(cfg: SparseMoE) -> str:
    """The key of ``cfg``'s measured damage in a calibration's ``moe["damage"]``.

    Example:
        >>> damage_key(SparseMoE(max_skip=2)), damage_key(SparseMoE(rule="row_union", max_skip=7, row_experts=8))
        ('threshold:2', 'row_union:7:8')
    """
    if cfg.rule == "row_union":
        return f"row_union:{cfg.max_skip}:{cfg.row_experts}"
    return f"{cfg.rule}:{cfg.max_skip}"
