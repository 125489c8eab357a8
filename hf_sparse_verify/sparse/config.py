"""Settings of lossy sparse verification (`SpeculationConfig.lossy_sparse_verify`).

Sparse verification skips work in the target's verify pass: KV blocks in attention, FFN channels, routed experts
(the sparse-verification paper, with the grouped schedules of the SSV paper). It is LOSSY: the verify pass no longer computes the
model's exact distribution, so greedy output can differ from plain ``generate``. It is off unless asked for;
`benchmarks/bench_sparse_quality.py` measures what each setting costs in quality.

Example:
    >>> from hf_sparse_verify.sparse import LossySparseVerify, SparseAttention
    >>> cfg = LossySparseVerify(attention=SparseAttention(rho=0.1, dense_below=4096))
    >>> cfg.attention.block_size, cfg.ffn, cfg.moe
    (64, None, None)
    >>> LossySparseVerify.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("shared", "shared_window", "approx_shared", "exact_merged")
BLOCK_SCORES = ("mean", "bounds")
MOE_RULES = ("threshold", "budget", "row_union")


def _number(name: str, value: Any, low: float, high: float, *, low_open=False, high_open=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if (value <= low if low_open else value < low) or (value >= high if high_open else value > high):
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name} must be in {lo}{low}, {high}{hi}, got {value!r}")


def _int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True)
class SparseAttention:
    """Block-sparse verify attention (the sparse-verification paper §3.1-3.3, the SSV paper's grouped schedules).

    Each verify step of layer ``l`` attends to the sink block, the last ``local_blocks`` blocks before the new
    tokens, the blocks holding the new tokens, and the top-scoring other blocks; a block's score is the query
    against the block's mean key (``score="mean"``, the paper's Eq. 5) or the upper bound of the query against the
    block's keys from their elementwise minimum and maximum (``score="bounds"``, Quest's), summed over the KV head's
    query heads. Budget per row (§3.2): every block while
    the row holds at most ``dense_below`` tokens, else ``((L - dense_below) * rho + dense_below) / block_size``
    blocks.

    Args:
        block_size: cache slots per block (a power of two >= 16). Default 64.
        rho: share of the tokens past ``dense_below`` kept (0 < rho <= 1). Default 0.1 (the paper's).
        dense_below: ``L0``: rows up to this many tokens verify densely. Default 4096 (the paper's safest).
        local_blocks: blocks right before the new tokens always kept. Default 2.
        schedule: which queries pick blocks: ``"shared_window"`` (the default: one selection per row, each block
            scored by the mean of the row's verify tokens' scores; with ``score="mean"`` that is the window's mean
            query against the mean keys, one batched matmul more per selecting layer; graded ``balanced`` at 8K and
            16K on the fixture, where ``"shared"`` fails at 16K: docs/results.md), ``"shared"`` (the first verify
            token's query, for every verify token of the row: paper 000's rule; the default until 2026-12-07),
            ``"approx_shared"`` (groups of ``group_size`` verify tokens, each group using
            its first query's blocks: SSV's approximate schedule) or ``"exact_merged"`` (every verify token picks
            its own blocks; the union is loaded once and masked per query: SSV's exact schedule).
        group_size: verify tokens per group for ``"approx_shared"``. Default 4.
        reuse: inter-layer reuse (§3.3): only the calibration's anchor layers pick blocks, the others reuse the
            nearest preceding anchor's selection. Needs a calibration with anchors; False: every layer picks.
        anchors: number of anchor layers the calibration chooses (lowest Jaccard similarity to the previous
            layer); None: a quarter of the layers.
        score: the block score, ``"mean"`` (the query against the block's mean key; a Triton kernel on the GPU) or
            ``"bounds"`` (Quest: ``sum_d max(q_d min_d, q_d max_d)`` over the block's keys; twice the summary
            memory, plain PyTorch ops for now).
    """

    block_size: int = 64
    rho: float = 0.1
    dense_below: int = 4096
    local_blocks: int = 2
    schedule: str = "shared_window"
    group_size: int = 4
    reuse: bool = False
    anchors: int | None = None
    score: str = "mean"

    def __post_init__(self) -> None:
        _int("block_size", self.block_size, 16)
        if self.block_size & (self.block_size - 1):
            raise ValueError(
                f"block_size must be a power of two >= 16 (16, 32, 64, ...), got {self.block_size}"
            )
        _number("rho", self.rho, 0.0, 1.0, low_open=True)
        _int("dense_below", self.dense_below, 0)
        _int("local_blocks", self.local_blocks, 0)
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}: use one of {SCHEDULES}")
        _int("group_size", self.group_size, 1)
        if not isinstance(self.reuse, bool):
            raise ValueError(f"reuse must be True or False, got {self.reuse!r}")
        if self.anchors is not None:
            _int("anchors", self.anchors, 1)
        if self.score not in BLOCK_SCORES:
            raise ValueError(f"unknown block score {self.score!r}: use one of {BLOCK_SCORES}")

    def budget_blocks(self, length: int) -> int:
        """Blocks a row of ``length`` tokens keeps (host-side twin of the device rule)."""
        blocks = -(-length // self.block_size)
        if length <= self.dense_below:
            return blocks
        keep = (length - self.dense_below) * self.rho + self.dense_below
        return min(blocks, -(-int(keep) // self.block_size))


@dataclass(frozen=True)
class SparseFFN:
    """Sparse FFN in verify (the sparse-verification paper §3.4): channels ``i`` whose activation ``|act(gate(x))_i|`` is under
    ``tau`` for every verify token of the row are skipped in ``up`` and ``down`` (one channel mask per row, so the
    saving survives batching).

    Args:
        tau: one threshold for every layer; None: the calibration's per-layer thresholds, chosen so that a share
            ``sparsity`` of the channels falls under them on the calibration prompts.
        sparsity: the target share of skipped channels for calibration. Default 0.5.
    """

    tau: float | None = None
    sparsity: float = 0.5

    def __post_init__(self) -> None:
        if self.tau is not None:
            _number("tau", self.tau, 0.0, float("inf"))
        _number("sparsity", self.sparsity, 0.0, 1.0, high_open=True)


@dataclass(frozen=True)
class SparseMoE:
    """Expert skipping in verify (the sparse-verification paper §3.5). Rules:

    - ``"threshold"``: per-layer threshold maps ``beta_m`` (m = 1 .. k-1, the median over calibration tokens of the
      share of routing weight held by a token's ``m`` lowest-weight experts); a token skips its ``i`` lowest-weight
      experts for the largest ``i <= max_skip`` whose share of the token's weight is under ``beta_i`` (see
      `hf_sparse_verify.kernels.expert_skip.naive.skip_counts` for our reading of the paper's Eq. 15-16). Weights are not
      renormalised.
    - ``"budget"``: a token keeps its highest-weight experts until their share of the token's routing weight reaches
      the layer's budget, and never fewer than ``k - max_skip``.
    - ``"row_union"`` (ours, not the paper's): the verify tokens of a row share one expert set per layer, the
      ``row_experts`` experts with the highest routing weight summed over the row's tokens; each token keeps its
      routed experts in that set, and never fewer than ``k - max_skip`` (its highest-weight ones first). A verify
      step's cost follows the distinct experts it reads, so this bounds them near ``row_experts`` where the
      per-token rules let ``q`` tokens spread over up to ``q * (k - max_skip)`` experts. No calibration.

    Args:
        rule: ``"threshold"``, ``"budget"`` or ``"row_union"``. Default ``"threshold"``.
        max_skip: ``m``, at most this many of the ``k`` routed experts skipped per token (1 <= m < k). Default 1.
        budget: for ``"budget"``: the share of routing weight kept (0 < budget <= 1), one for every layer; None: per
            layer from calibration (the median share held by the top ``k - max_skip`` experts).
        row_experts: for ``"row_union"`` (required there, unused elsewhere): experts per row and layer kept by
            summed routing weight (>= 1).
        max_damage: calibration refuses a setting whose verify-pass NLL on the calibration prompts grows by more
            than this share over dense verification (0.05 = +5%). Default 0.05.
    """

    rule: str = "threshold"
    max_skip: int = 1
    budget: float | None = None
    row_experts: int | None = None
    max_damage: float = 0.05

    def __post_init__(self) -> None:
        if self.rule not in MOE_RULES:
            raise ValueError(f"unknown rule {self.rule!r}: use one of {MOE_RULES}")
        _int("max_skip", self.max_skip, 1)
        if self.budget is not None:
            _number("budget", self.budget, 0.0, 1.0, low_open=True)
        if self.rule == "row_union":
            if self.row_experts is None:
                raise ValueError("rule 'row_union' needs row_experts (experts per row and layer), e.g. 8")
            _int("row_experts", self.row_experts, 1)
        elif self.row_experts is not None:
            raise ValueError(f"row_experts is read by rule 'row_union' only; rule is {self.rule!r}")
        _number("max_damage", self.max_damage, 0.0, float("inf"))


_PARTS = {"attention": SparseAttention, "ffn": SparseFFN, "moe": SparseMoE}


@dataclass(frozen=True)
class LossySparseVerify:
    """LOSSY sparse verification: which parts of the verify pass skip work. Each part None = dense.

    Args:
        attention / ffn / moe: the parts' settings (a dict is accepted for each).
        calibration: folder or Hub id holding ``sparse_verify_calibration.json`` (written by
            ``hf-sparse-verify calibrate``), or the file itself; None: the model's own folder when it has one.
            Needed by ``attention.reuse``, by ``ffn`` without ``tau`` and by ``moe`` with calibrated thresholds.
    """

    attention: SparseAttention | None = dataclasses.field(default_factory=SparseAttention)
    ffn: SparseFFN | None = None
    moe: SparseMoE | None = None
    calibration: str | None = None

    def __post_init__(self) -> None:
        for name, cls in _PARTS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
                if unknown:
                    raise ValueError(f"unknown lossy_sparse_verify.{name} field(s) {unknown}")
                object.__setattr__(self, name, cls(**value))
            elif value is not None and not isinstance(value, cls):
                raise ValueError(
                    f"lossy_sparse_verify.{name} must be a {cls.__name__}, a dict or None, got {value!r}"
                )
        if self.attention is None and self.ffn is None and self.moe is None:
            raise ValueError(
                "lossy_sparse_verify with attention, ffn and moe all None does nothing: set one of them, or leave "
                "lossy_sparse_verify=None for (lossless) dense verification"
            )
        if self.calibration is not None and not isinstance(self.calibration, str):
            raise ValueError(f"calibration must be a folder, file or Hub id (str), got {self.calibration!r}")

    def needs_calibration(self) -> bool:
        return bool(
            (self.attention is not None and self.attention.reuse)
            or (self.ffn is not None and self.ffn.tau is None)
            or (
                self.moe is not None
                and (self.moe.rule == "threshold" or (self.moe.rule == "budget" and self.moe.budget is None))
            )
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossySparseVerify:
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown lossy_sparse_verify field(s) {unknown}")
        return cls(**data)
