"""Calibration of expert skipping (sparse verification paper, §3.5): the routing statistics of a model's MoE layers,
the per-layer threshold maps, and the measured cost of each rule in teacher-forced NLL. A driver: it runs the model
(through `hf_sparse_verify.integrations.speculation_mode`), so it sits above the engine. The rules themselves are
`hf_sparse_verify.kernels.expert_skip.naive`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from .._compat import experts_layers
from ..integrations import Mode, speculation_mode
from ..sparse.calibration import damage_key
from ..sparse.config import SparseMoE
from ..sparse.moe import ExpertSkips
from ..step.context import StepContext, step_scope
from ..step.slots import MoESkip, VerifySparsity

_TINY = 1e-30


@contextlib.contextmanager
def expert_skipping(model: torch.nn.Module) -> Iterator[None]:
    """Within the block every experts block of ``model`` runs ``"hsv_fused"``, the implementation that applies a
    verify step's `MoESkip` (on CPU its plain PyTorch reference), through the library's one switch."""
    with speculation_mode(model, mode=Mode(attention=False, expert_skipping=True)) as switched:
        with switched.decoding_experts():
            yield


class RouterStats:
    """Records the top-k routing weights every MoE layer hands its experts, for calibration.

    A forward pre-hook on each experts block (found by `hf_sparse_verify._compat.experts_layers`) copies its
    ``top_k_weights`` argument, as each token's shares sorted descending, to the CPU. Use as a context manager; the
    hooks are removed on exit.

    Example:
        >>> with RouterStats(model) as stats:  # doctest: +SKIP
        ...     model(ids)
        >>> stats.threshold_maps().shape  # doctest: +SKIP
        torch.Size([layers, k - 1])
    """

    def __init__(self, model: torch.nn.Module):
        self.modules = experts_layers(model)
        if not self.modules:
            raise ValueError(
                f"{type(model).__name__} has no transformers experts blocks (use_experts_implementation): nothing "
                f"to calibrate for expert skipping"
            )
        self._shares: dict[int, list[torch.Tensor]] = {}
        self._hooks: list = []

    def __enter__(self) -> RouterStats:
        for module, layer in self.modules.items():
            self._hooks.append(module.register_forward_pre_hook(self._hook(layer), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    def _hook(self, layer: int):
        def record(module, args, kwargs):
            weights = kwargs["top_k_weights"] if "top_k_weights" in kwargs else args[2]
            self.add(layer, weights)

        return record

    def add(self, layer: int, top_k_weights: torch.Tensor) -> None:
        """Record ``top_k_weights`` ``[T, k]`` of layer ``layer``."""
        w = torch.sort(top_k_weights.detach().float(), dim=-1, descending=True).values
        self._shares.setdefault(layer, []).append((w / w.sum(-1, keepdim=True).clamp_min(_TINY)).cpu())

    @property
    def layers(self) -> list[int]:
        """The layers that recorded tokens, ascending: the rows of `threshold_maps` and `budgets`."""
        return sorted(self._shares)

    def shares(self, layer: int) -> torch.Tensor:
        """``[N, k]`` float32: each recorded token's routing-weight shares of layer ``layer``, highest first."""
        return torch.cat(self._shares[layer])

    def _stacked(self) -> list[torch.Tensor]:
        if not self._shares:
            raise RuntimeError(
                "RouterStats recorded no tokens: run calibration forwards inside the `with` block"
            )
        shares = [self.shares(layer) for layer in self.layers]
        ks = {s.shape[1] for s in shares}
        if len(ks) != 1:
            raise ValueError(f"MoE layers route to different numbers of experts {sorted(ks)}: not supported")
        return shares

    def threshold_maps(self) -> torch.Tensor:
        """``[layers, k-1]`` float32: ``beta_m`` = median over tokens of the share held by the ``m`` lowest-weight
        experts, ``m = 1 .. k-1`` (the interpolated median, as ``numpy.median``)."""
        rows = []
        for s in self._stacked():
            low = torch.cumsum(s.flip(-1), dim=-1)[:, :-1]  # [N, k-1] share of the 1 .. k-1 lowest
            rows.append(torch.quantile(low, 0.5, dim=0))
        return torch.stack(rows)

    def budgets(self, max_skip: int) -> torch.Tensor:
        """``[layers]`` float32: median over tokens of the share held by the top ``k - max_skip`` experts."""
        rows = []
        for s in self._stacked():
            k = s.shape[1]
            if not 1 <= max_skip < k:
                raise ValueError(f"max_skip must be in [1, k - 1] = [1, {k - 1}], got {max_skip}")
            rows.append(torch.quantile(s[:, : k - max_skip].sum(-1), 0.5))
        return torch.stack(rows)

    def summary(self) -> dict:
        """The ``moe`` entry of a `SparseCalibration` (JSON-ready): ``layers``, ``k``, ``thresholds``
        ``[layers][k-1]``, ``budgets`` ``{str(m): [layers]}`` for every ``m`` in ``1 .. k-1``, and an empty
        ``damage`` ``{"rule:m": damage}`` that `calibrate_moe` fills."""
        maps = self.threshold_maps()
        k = maps.shape[1] + 1
        return {
            "layers": self.layers,
            "k": k,
            "thresholds": maps.tolist(),
            "budgets": {str(m): self.budgets(m).tolist() for m in range(1, k)},
            "damage": {},
        }


def _nll(
    logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[float, int]:
    """Summed next-token NLL of ``input_ids`` ``[B, T]`` under ``logits`` ``[B, T, V]`` and the token count."""
    targets = input_ids[:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), targets, reduction="none"
    )  # [B, T-1]
    if attention_mask is not None:
        keep = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
        return float(losses[keep].sum()), int(keep.sum())
    return float(losses.sum()), losses.numel()


def _verify_step(input_ids: torch.Tensor, sparsity: VerifySparsity) -> StepContext:
    """A verify step over the whole of ``input_ids`` that carries ``sparsity`` (read by our experts function)."""
    batch, length = input_ids.shape
    zeros = torch.zeros(batch, dtype=torch.int64, device=input_ids.device)
    return StepContext(
        phase="verify", start=zeros, pad=zeros, q_len=length, kv_len=length, verify_sparsity=sparsity
    )


@torch.no_grad()
def measure_damage(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    skips: dict[int, MoESkip],
    attention_mask: torch.Tensor | None = None,
) -> dict[str, float]:
    """Teacher-forced next-token NLL of ``input_ids`` ``[B, T]`` with and without expert skipping.

    Both forwards run the ``"hsv_fused"`` experts (switched on for the call with
    `expert_skipping`, also on CPU, where the op runs its reference); the sparse
    one runs inside a verify `StepContext` whose `ExpertSkips` slot answers ``skips``, so skipping goes through the
    code a verify step runs. The model's attention is used as it is (a plain forward, no cache).

    Returns:
        ``dense_nll`` / ``sparse_nll`` (mean per predicted token), ``damage = sparse_nll / dense_nll - 1`` and
        ``tokens`` (predicted tokens counted).

    Example:
        >>> measure_damage(model, ids, {})["damage"]  # doctest: +SKIP
        0.0
    """
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    with expert_skipping(model):
        dense, tokens = _nll(model(input_ids, **kwargs).logits, input_ids, attention_mask)
        with step_scope(_verify_step(input_ids, ExpertSkips(skips))):
            sparse, _ = _nll(model(input_ids, **kwargs).logits, input_ids, attention_mask)
    dense, sparse = dense / max(tokens, 1), sparse / max(tokens, 1)
    return {"dense_nll": dense, "sparse_nll": sparse, "damage": sparse / dense - 1.0, "tokens": tokens}


@dataclass
class MoECalibration:
    """Calibrated expert skipping (`calibrate_moe`).

    Attributes:
        rule / max_skip: as in `SparseMoE`.
        layers: the MoE layer indices, the rows of ``values``.
        values: ``[layers, k-1]`` threshold maps (``"threshold"``) or ``[layers]`` budgets (``"budget"``), float32.
        dense_nll / sparse_nll / damage: `measure_damage` over all calibration tokens.
        summary: `RouterStats.summary` with this setting's damage under ``"rule:max_skip"`` (the ``moe`` entry of a
            `SparseCalibration`).
    """

    rule: str
    max_skip: int
    layers: list[int]
    values: torch.Tensor
    dense_nll: float
    sparse_nll: float
    damage: float
    summary: dict

    def skips(self, devices: dict[int, torch.device] | None = None) -> dict[int, MoESkip]:
        """``{layer: MoESkip}``, each ``values`` on ``devices[layer]`` (default CPU)."""
        devices = devices or {}
        return {
            layer: MoESkip(self.rule, self.max_skip, self.values[row].to(devices.get(layer, "cpu")))
            for row, layer in enumerate(self.layers)
        }


def _batch(item) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(item, torch.Tensor):
        return item, None
    return item["input_ids"], item.get("attention_mask")


def _windows(input_ids: torch.Tensor, mask: torch.Tensor | None, window: int):
    """Cut each row to a multiple of ``window`` tokens, so that windows of the flattened ``[B * T]`` tokens never
    straddle two rows."""
    length = input_ids.shape[1] - input_ids.shape[1] % window
    if length == 0:
        raise ValueError(f"row_union calibration needs prompts of at least window={window} tokens")
    return input_ids[:, :length], None if mask is None else mask[:, :length]


def calibrate_moe(
    model: torch.nn.Module, batches: Iterable, cfg: SparseMoE, progress: bool = True, window: int = 8
) -> MoECalibration:
    """Calibrate ``cfg`` on ``batches`` and check its cost.

    One dense pass records the routing weights (`RouterStats`) and gives per-layer threshold maps (``"threshold"``)
    or budgets (``"budget"``: ``cfg.budget`` for every layer when set, else the calibrated median share of the top
    ``k - max_skip``); a second pass measures the NLL with and without skipping (`measure_damage`). ``"row_union"``
    has nothing to calibrate (its ``values`` are ``row_experts`` for every layer); its damage is measured with the
    prompts cut into rows of ``window`` consecutive tokens, each row sharing one expert set as a verify row of
    ``window`` tokens does (a verify row's KV comes from the same sparse pass, so one teacher-forced forward is
    faithful to it).

    Args:
        model: a MoE causal LM.
        batches: ``input_ids`` ``[B, T]`` tensors, or dicts with ``input_ids`` and optional ``attention_mask``
            (on the model's device); iterated twice.
        cfg: the `SparseMoE` settings.
        progress: log each stage to stderr.

    Raises:
        ValueError: ``max_skip`` not below the layers' ``k``, or a damage above ``cfg.max_damage``.

    Example:
        >>> cal = calibrate_moe(model, [ids], SparseMoE(max_skip=1, max_damage=0.5))  # doctest: +SKIP
        >>> slot_skips = cal.skips()  # doctest: +SKIP
    """
    batches = [_batch(b) for b in batches]
    if not batches:
        raise ValueError("calibrate_moe needs at least one batch of input_ids")

    def say(message: str) -> None:
        if progress:
            print(f"hf_sparse_verify calibrate moe: {message}", file=sys.stderr)

    stats = RouterStats(model)
    with stats, expert_skipping(model), torch.no_grad():
        for input_ids, mask in batches:
            model(input_ids, **({} if mask is None else {"attention_mask": mask}))
    k = stats.shares(stats.layers[0]).shape[1]
    if not 1 <= cfg.max_skip < k:
        raise ValueError(f"max_skip={cfg.max_skip} must be below the {k} experts each token is routed to")
    if cfg.rule == "threshold":
        values = stats.threshold_maps()
    elif cfg.rule == "row_union":
        values = torch.full((len(stats.layers),), float(cfg.row_experts))
    elif cfg.budget is not None:
        values = torch.full((len(stats.layers),), float(cfg.budget))
    else:
        values = stats.budgets(cfg.max_skip)
    say(f"{cfg.rule} rule over {len(stats.layers)} MoE layers, k={k}, max_skip={cfg.max_skip}")

    devices = {layer: module.gate_up_proj.device for module, layer in stats.modules.items()}
    cal = MoECalibration(
        cfg.rule, cfg.max_skip, stats.layers, values, math.nan, math.nan, math.nan, stats.summary()
    )
    skips = cal.skips(devices)
    if cfg.rule == "row_union":
        skips = {layer: dataclasses.replace(skip, group=window) for layer, skip in skips.items()}
    dense = sparse = 0.0
    tokens = 0
    for n, (input_ids, mask) in enumerate(batches):
        if cfg.rule == "row_union":
            input_ids, mask = _windows(input_ids, mask, window)
        result = measure_damage(model, input_ids, skips, mask)
        dense += result["dense_nll"] * result["tokens"]
        sparse += result["sparse_nll"] * result["tokens"]
        tokens += result["tokens"]
        say(f"batch {n + 1}/{len(batches)}: damage {result['damage']:+.2%}")
    cal.dense_nll, cal.sparse_nll = dense / max(tokens, 1), sparse / max(tokens, 1)
    cal.damage = cal.sparse_nll / cal.dense_nll - 1.0
    cal.summary["damage"][damage_key(cfg)] = cal.damage
    if cal.damage > cfg.max_damage:
        raise ValueError(
            f"expert skipping with max_skip={cfg.max_skip} ({damage_key(cfg)}) raises the calibration NLL by "
            f"{cal.damage:.2%} (bound {cfg.max_damage:.2%}): lower max_skip or raise max_damage"
        )
    say(f"NLL {cal.dense_nll:.4f} -> {cal.sparse_nll:.4f} ({cal.damage:+.2%}, bound {cfg.max_damage:.2%})")
    return cal


__all__ = [
    "MoECalibration",
    "RouterStats",
    "calibrate_moe",
    "damage_key",
    "expert_skipping",
    "measure_damage",
]
