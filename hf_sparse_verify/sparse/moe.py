"""Expert skipping in verify (papers/000 §3.5): how many routed experts each token keeps, the calibration of the
per-layer thresholds, and the measured cost in NLL.

Reading of the paper. §3.5 sorts a token's ``k`` routing weights ascending, ``w_1 <= .. <= w_k``, and writes the
calibration ratio (Eq. 15) and the skip test (Eq. 16) over ``sum_{j <= k-m} w_j``: the LOWEST ``k - m`` weights.
Taken literally that is not the weight of the experts it then skips (the ``i`` lowest, ``e_1 .. e_i``), and for
``k = 2`` it does not reduce to the rule it generalises (Lu et al. 2024: skip the second expert when its weight is
small against the first). We read both equations over the experts that are skipped:

- ``r_m`` = share of the token's routing weight held by its ``m`` lowest-weight experts,
  ``sum_{j <= m} w_j / sum_j w_j`` (= 1 - the share of its top ``k - m``, the descending-order reading of Eq. 15);
- calibration: ``beta_m`` = median of ``r_m`` over the calibration tokens of the layer, ``m = 1 .. k-1``;
- inference: skip the ``i`` lowest-weight experts for the largest ``i`` in ``1 .. max_skip`` with
  ``r_i < beta_i`` (Eq. 16 with ``beta_i`` where the paper prints ``beta_m``: the map holds one threshold per skip
  size), none when no ``i`` passes. So a token skips ``i`` experts when those experts hold less of its weight than
  they do for the median calibration token.

The kept experts' weights are NOT renormalised: the paper says nothing of it and Lu et al. skip without it, so a
kept expert contributes exactly what it does in the dense pass (also what the fused op does with ``n_active``).

Shares are computed in float32 from the weights the router hands the experts (after its own top-k normalisation,
where the model has one).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .._compat import experts_layers
from ..step.context import StepContext, step_scope
from ..step.slots import MoESkip, VerifySparsity
from .config import SparseMoE

_TINY = 1e-30


def order_by_weight(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts sorted by routing weight, highest first (stable: ties keep their order, and an already
    sorted row is returned unchanged), so that "the first ``n_active``" of `skip_counts` are the kept experts.

    Args:
        top_k_index: ``[T, k]`` expert ids.
        top_k_weights: ``[T, k]`` routing weights.

    Returns:
        ``(index [T, k], weights [T, k])``, same dtypes.

    Example:
        >>> order_by_weight(torch.tensor([[3, 1, 2]]), torch.tensor([[0.2, 0.5, 0.3]]))
        (tensor([[1, 2, 3]]), tensor([[0.5000, 0.3000, 0.2000]]))
    """
    weights, order = torch.sort(top_k_weights, dim=-1, descending=True, stable=True)
    return torch.gather(top_k_index, -1, order), weights


def _shares(top_k_weights: torch.Tensor, descending: bool) -> torch.Tensor:
    """``[T, k]`` float32 cumulative shares: entry ``j`` is the share of the ``j + 1`` lowest (or highest) weights."""
    w = top_k_weights.float()
    w = torch.sort(w, dim=-1, descending=descending).values
    return torch.cumsum(w, dim=-1) / w.sum(dim=-1, keepdim=True).clamp_min(_TINY)


def skip_counts(top_k_weights: torch.Tensor, skip: MoESkip) -> torch.Tensor:
    """How many of its ``k`` routed experts each token keeps under ``skip`` (no host sync; capturable).

    Rules (``m = min(skip.max_skip, k - 1)``; shares of the token's summed top-k weight, see the module docstring):

    - ``"threshold"`` (``skip.values`` ``[k-1]`` = ``beta_1 .. beta_{k-1}``): skip the ``i`` lowest-weight experts
      for the largest ``i <= m`` whose share ``r_i`` is strictly under ``beta_i``; ``i = 0`` when none is.
    - ``"budget"`` (``skip.values`` ``[]`` = budget): keep the fewest highest-weight experts whose share reaches the
      budget (``>=``), and never fewer than ``k - m``.

    Tied weights: the shares do not depend on which of them is dropped; `order_by_weight` keeps the earlier one.

    Args:
        top_k_weights: ``[T, k]`` routing weights (any float dtype, any order).
        skip: the layer's `MoESkip`.

    Returns:
        ``n_active`` ``[T]`` int32 in ``[k - m, k]``.

    Example:
        >>> w = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.3, 0.3]])
        >>> skip_counts(w, MoESkip("threshold", 2, torch.tensor([0.2, 0.5]))).tolist()
        [1, 3]
        >>> skip_counts(w, MoESkip("budget", 2, torch.tensor(0.85))).tolist()
        [2, 3]
    """
    tokens, k = top_k_weights.shape
    m = min(int(skip.max_skip), k - 1)
    if m < 1:
        return torch.full((tokens,), k, dtype=torch.int32, device=top_k_weights.device)
    if skip.rule == "threshold":
        low = _shares(top_k_weights, descending=False)[:, :m]  # [T, m] r_1 .. r_m
        passes = low < skip.values[:m].to(low.device, torch.float32)[None, :]
        sizes = torch.arange(1, m + 1, device=low.device, dtype=torch.int32)
        skipped = torch.where(passes, sizes, 0).amax(dim=-1)  # [T]
        return (k - skipped).to(torch.int32)
    if skip.rule == "budget":
        top = _shares(top_k_weights, descending=True)  # [T, k] share of the top 1 .. k
        budget = skip.values.to(top.device, torch.float32)
        short = (top < budget).sum(dim=-1)  # [T] how many top counts miss the budget
        return (short + 1).clamp(k - m, k).to(torch.int32)
    raise ValueError(
        f"skip_counts handles the per-token rules 'threshold' and 'budget', got {skip.rule!r} (row_union: use "
        f"`row_union`)"
    )


def row_union(
    top_k_index: torch.Tensor, top_k_weights: torch.Tensor, skip: MoESkip, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``"row_union"`` rule (ours): rows of ``group`` consecutive tokens share one expert set per layer.

    A row's set is its ``N = skip.values`` experts of highest routing weight summed over the row's tokens (ties: the
    lower expert id first). Each token keeps its routed experts in the set, and never fewer than
    ``k - m`` (``m = min(max_skip, k - 1)``): the kept experts come first in its order (set members, then the rest,
    each by weight, highest first; stable), so "the first ``n_active``" are the kept ones, as for the other rules.

    Args:
        top_k_index: ``[T, k]`` expert ids, ``T`` a multiple of ``group``.
        top_k_weights: ``[T, k]`` routing weights.
        skip: a ``"row_union"`` `MoESkip`.
        group: tokens per row (the verify step's ``q_len``).

    Returns:
        ``(index [T, k], weights [T, k], n_active [T] int32)``; no host sync, capturable.

    Example:
        >>> idx = torch.tensor([[0, 1], [2, 0]])
        >>> w = torch.tensor([[0.6, 0.4], [0.7, 0.3]])
        >>> row_union(idx, w, MoESkip("row_union", 1, torch.tensor(1.0)), group=2)  # expert 0 sums 0.9
        (tensor([[0, 1],
                [0, 2]]), tensor([[0.6000, 0.4000],
                [0.3000, 0.7000]]), tensor([1, 1], dtype=torch.int32))
    """
    tokens, k = top_k_index.shape
    if group < 1 or tokens % group:
        raise ValueError(f"row_union needs T = {tokens} tokens in rows of group = {group} (a divisor of T)")
    m = min(int(skip.max_skip), k - 1)
    ids = top_k_index.reshape(tokens // group, group * k)  # [R, P]
    w = top_k_weights.float().reshape(ids.shape)
    pairs = torch.arange(group * k, device=ids.device)
    same = ids[:, :, None] == ids[:, None, :]  # [R, P, P]: pair a (dim 1) and pair b (dim 2) name one expert
    summed = torch.where(same, w[:, None, :], 0.0).sum(-1)  # [R, P]: the row's weight of pair a's expert
    first = ~(same & (pairs[None, :] < pairs[:, None])[None]).any(-1)  # [R, P]: pair a is its expert's first
    heavier = (summed[:, None, :] > summed[:, :, None]) | (
        (summed[:, None, :] == summed[:, :, None]) & (ids[:, None, :] < ids[:, :, None])
    )
    rank = (first[:, None, :] & heavier).sum(-1)  # [R, P]: experts of the row ranked above pair a's
    in_set = (rank < skip.values.to(rank.device, torch.float32)).reshape(tokens, k)
    order = torch.sort(top_k_weights.float(), dim=-1, descending=True, stable=True).indices  # by weight
    out_first = (~torch.gather(in_set, -1, order)).to(torch.uint8)  # then set members first, stable
    order = torch.gather(order, -1, torch.sort(out_first, dim=-1, stable=True).indices)
    n_active = in_set.sum(-1).clamp_min(k - m).to(torch.int32)
    return torch.gather(top_k_index, -1, order), torch.gather(top_k_weights, -1, order), n_active


def active_mask(n_active: torch.Tensor, k: int) -> torch.Tensor:
    """``[T, k]`` bool: rank ``r`` (of `order_by_weight`'s order) is kept when ``r < n_active[t]``."""
    return torch.arange(k, device=n_active.device)[None, :] < n_active[:, None]


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
    ``experts_for_decoding(model, expert_skipping=True)``, also on CPU, where the op runs its reference); the sparse
    one runs inside a verify `StepContext` whose `ExpertSkips` slot answers ``skips``, so skipping goes through the
    code a verify step runs. The model's attention is used as it is (a plain forward, no cache).

    Returns:
        ``dense_nll`` / ``sparse_nll`` (mean per predicted token), ``damage = sparse_nll / dense_nll - 1`` and
        ``tokens`` (predicted tokens counted).

    Example:
        >>> measure_damage(model, ids, {})["damage"]  # doctest: +SKIP
        0.0
    """
    from ..moe.experts import experts_for_decoding  # hf_sparse_verify.moe imports this module

    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    with experts_for_decoding(model, expert_skipping=True):
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


def damage_key(cfg: SparseMoE) -> str:
    """The key of ``cfg``'s measured damage in a calibration's ``moe["damage"]``.

    Example:
        >>> damage_key(SparseMoE(max_skip=2)), damage_key(SparseMoE(rule="row_union", max_skip=7, row_experts=8))
        ('threshold:2', 'row_union:7:8')
    """
    if cfg.rule == "row_union":
        return f"row_union:{cfg.max_skip}:{cfg.row_experts}"
    return f"{cfg.rule}:{cfg.max_skip}"


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
    from ..moe.experts import experts_for_decoding  # hf_sparse_verify.moe imports this module

    batches = [_batch(b) for b in batches]
    if not batches:
        raise ValueError("calibrate_moe needs at least one batch of input_ids")

    def say(message: str) -> None:
        if progress:
            print(f"hf_sparse_verify calibrate moe: {message}", file=sys.stderr)

    stats = RouterStats(model)
    with stats, experts_for_decoding(model, expert_skipping=True), torch.no_grad():
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
    "ExpertSkips",
    "MoECalibration",
    "RouterStats",
    "active_mask",
    "calibrate_moe",
    "damage_key",
    "measure_damage",
    "order_by_weight",
    "row_union",
    "skip_counts",
]
