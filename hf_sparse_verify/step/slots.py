"""The typed slots of a `StepContext`, one per feature, each with one owner.

- `KVSelection` (owner: the self-speculative drafter): which cached tokens a draft step attends to.
- `ScoreCollection` (owner: the Vegas drafter): attention scores a verify or prefill step writes per layer.
- `VerifySparsity` (owner: sparse verification): what a verify step may skip (attention blocks, FFN channels,
  experts). Sparse verification is lossy and opt-in; the slot stays None on every lossless path.

Per-layer buffers live on their layer's device (accelerate device maps put layers on several GPUs); `LayerStack`
keeps them as views of one stacked tensor per device, so batched work (one top-k over all layers) runs once per
device instead of once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class LayerStack:
    """Per-layer tensors of one shape, stored as one ``[layers_on_device, *shape]`` tensor per device.

    Args:
        devices: the device of each layer.
        shape / dtype: of one layer's tensor.
        fill: initial value.

    Example:
        >>> s = LayerStack([torch.device("cpu")] * 3, (2,), torch.int64)
        >>> _ = s.layer(1).fill_(7)
        >>> s.groups[0][1].tolist()
        [[0, 0], [7, 7], [0, 0]]
    """

    def __init__(self, devices: list[torch.device], shape: tuple, dtype: torch.dtype, fill: float = 0):
        self.devices = devices
        self.groups: list[tuple[list[int], torch.Tensor]] = []  # (layer indices, [n, *shape]) per device
        self._where: list[tuple[int, int]] = [(0, 0)] * len(devices)
        for device in dict.fromkeys(devices):
            layers = [i for i, d in enumerate(devices) if d == device]
            for position, layer in enumerate(layers):
                self._where[layer] = (len(self.groups), position)
            self.groups.append((layers, torch.full((len(layers), *shape), fill, dtype=dtype, device=device)))

    def layer(self, layer: int) -> torch.Tensor:
        group, position = self._where[layer]
        return self.groups[group][1][position]


class KVSelection:
    """Draft-time KV selection of one self-speculative strategy (base class).

    A draft step of layer ``l`` attends to the selected prefix slots of the row plus every slot
    ``>= recent_start(l)`` (tokens appended since the selection was made). Subclasses give the selection in
    index form (`gather_index`, read by the token-sparse kernel and gather backends) and/or as a mask
    (`allowed`, read by the reference backend).

    Attributes:
        recent_min: host-side lower bound of ``recent_start`` over rows and layers (eager gather backends slice
            the recent slots ``[recent_min, kv_len)``; kernels read the device-side ``recent_start``).
    """

    recent_min: int = 0

    def recent_start(self, layer: int) -> torch.Tensor:
        """``[B]`` int64: slots ``>= recent_start`` are always attended."""
        raise NotImplementedError

    def gather_index(
        self, layer: int, query: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(index [B, k_max] int64, count [B] int64)``: the first ``count[b]`` entries of ``index[b]`` are the
        selected prefix slots of row ``b``; None when the selection exists only as a mask. ``query``
        ``[B, H, 1, D]`` is the draft step's query, for query-aware selections (Quest)."""
        return None

    def allowed(
        self, layer: int, query: torch.Tensor, key: torch.Tensor, pad: torch.Tensor, length: int
    ) -> torch.Tensor:
        """``[B, length]`` bool over slots ``[0, length)``: selected prefix slots or slots ``>= recent_start``.

        Default: built from `gather_index`. ``query`` ``[B, H, q, D]`` and ``key`` ``[B, H_kv, L, D]`` are there
        for query-aware selections (Quest)."""
        index, count = self.gather_index(layer, query)
        batch, k_max = index.shape
        valid = torch.arange(k_max, device=index.device)[None, :] < count[:, None]
        # unused entries go to a spare column, so they never clear a selected slot
        target = torch.where(valid, index.clamp_max(length - 1), length)
        mask = torch.zeros(batch, length + 1, dtype=torch.bool, device=index.device)
        mask.scatter_(1, target, True)
        slots = torch.arange(length, device=index.device)
        return mask[:, :length] | (slots[None, :] >= self.recent_start(layer)[:, None])


class ScoreCollection:
    """Per-layer attention scores that verify (and prefill) steps write, for verification-guided selection.

    Attributes:
        rows: which query rows are reduced: ``"two_rows"`` (first and last row of the step, Collect-2-Query),
            ``"all_rows"``, ``"per_row"`` (no reduction: ``[B, q, L]``); prefill steps always reduce their last
            `PREFILL_SEED_ROWS` rows.
        weights: score by softmax weights ``exp(logit - lse)`` (heads comparable) instead of raw logits.
        per_kv_head: keep one score per KV head (``[B, H_kv, L]``) instead of the mean over all heads.
        lse: the ``lse`` of the weights. ``"step"``: each scored row's own log-sum-exp (exact softmax weights;
            the fused kernel stores the scored rows' logits and normalises them after the merge). ``"carried"``:
            per query head, the log-sum-exp of the previous verify step's first row (its last committed token; the
            prompt's last token for the first verify), so the attention kernel sums the weights in the same pass
            (approximate weights: the normaliser is one step old). `carried_lse` holds it per layer, ``[B, H]`` float32.
    """

    PREFILL_SEED_ROWS = 8
    LSE_MODES = ("step", "carried")

    def __init__(
        self, rows: str = "two_rows", weights: bool = True, per_kv_head: bool = False, lse: str = "step"
    ):
        if rows not in ("two_rows", "all_rows", "per_row"):
            raise ValueError(f"rows must be 'two_rows', 'all_rows' or 'per_row', got {rows!r}")
        if lse not in self.LSE_MODES:
            raise ValueError(f"lse must be one of {self.LSE_MODES}, got {lse!r}")
        if lse == "carried" and (not weights or rows == "per_row"):
            raise ValueError(
                "lse='carried' normalises softmax weights of reduced rows: use weights=True and rows 'two_rows' or "
                f"'all_rows' (got weights={weights}, rows={rows!r})"
            )
        self.rows = rows
        self.weights = weights
        self.per_kv_head = per_kv_head
        self.lse = lse
        self.carried: dict[int, torch.Tensor] = {}
        self.scores: dict[int, torch.Tensor] = {}
        self.buffers: dict[int, torch.Tensor] = {}
        self.blocks: dict[tuple[int, ...], torch.Tensor] = {}

    def write(self, layer: int, scores: torch.Tensor) -> None:
        """Store layer ``layer``'s scores ``[B, (H_kv,) L]`` (``[B, q, L]`` for ``"per_row"``). Layers with a fixed
        buffer (`fix_buffers`, for captured steps) copy into it; slots past ``L`` are left as they are."""
        buffer = self.buffers.get(layer)
        if buffer is None:
            self.scores[layer] = scores
            return
        length = scores.shape[-1]
        buffer[..., :length].copy_(scores)
        self.scores[layer] = buffer

    def fix_buffers(self, shapes: dict[int, tuple[tuple, torch.device]]) -> None:
        """Give layers fixed float32 buffers (``layer -> (shape, device)``) that later writes copy into. Consecutive
        layers of one device and shape share one ``[n, *shape]`` block (`block`), so a selection over all of them
        reads the block without stacking."""
        runs: list[tuple[torch.device, tuple, list[int]]] = []
        for layer, (shape, device) in shapes.items():
            if layer in self.buffers:
                continue
            if runs and runs[-1][:2] == (device, shape) and runs[-1][2][-1] == layer - 1:
                runs[-1][2].append(layer)
            else:
                runs.append((device, shape, [layer]))
        for device, shape, layers in runs:
            block = torch.zeros(len(layers), *shape, dtype=torch.float32, device=device)
            self.blocks[tuple(layers)] = block
            for i, layer in enumerate(layers):
                self.buffers[layer] = block[i]

    def block(self, layers: list[int]) -> torch.Tensor | None:
        """The fixed buffers of ``layers`` as one ``[N, ...]`` tensor when they were allocated as one block (None
        otherwise)."""
        block = self.blocks.get(tuple(layers))
        if block is not None:
            for layer in layers:
                self.layer(layer)  # every layer must have written its scores
        return block

    def layer(self, layer: int) -> torch.Tensor:
        if layer not in self.scores:
            raise RuntimeError(f"the verify pass collected no attention scores for layer {layer}")
        return self.scores[layer]

    def carry(self, layer: int, lse: torch.Tensor) -> None:
        """Set layer ``layer``'s carried log-sum-exp ``[B, H]`` (the prefill's last row). The first write keeps
        the tensor; later writes copy into it (captured verify steps read and update it in place)."""
        kept = self.carried.get(layer)
        if kept is not None and kept.shape == lse.shape and kept.device == lse.device:
            kept.copy_(lse)
        else:
            self.carried[layer] = lse.float().contiguous()

    def carried_lse(self, layer: int) -> torch.Tensor | None:
        """``[B, H]`` float32 carried log-sum-exp of layer ``layer`` (None unless ``lse == "carried"``); the verify
        step reads it and overwrites it with its own last row's."""
        if self.lse != "carried":
            return None
        if layer not in self.carried:
            raise RuntimeError(
                f"no carried log-sum-exp for layer {layer}: the prefill writes the first one (run the prefill "
                "with this collection in the step)"
            )
        return self.carried[layer]


@dataclass
class MoESkip:
    """Expert skipping of one MoE layer in a verify step (lossy, see `hf_sparse_verify.sparse.SparseMoE`).

    Attributes:
        rule: ``"threshold"`` (``values`` ``[k - 1]`` float32: the layer's threshold map ``beta_1 .. beta_{k-1}``)
            or ``"budget"`` (``values`` ``[]`` float32: the share of routing weight kept) or ``"row_union"``
            (``values`` ``[]`` float32: experts per row kept by summed routing weight; rows are the step's
            ``q_len`` consecutive tokens).
        max_skip: at most this many of a token's ``k`` routed experts are skipped.
        values: on the layer's device, fixed for the life of the slot (CUDA graphs read it).
        group: ``"row_union"`` rows of this many consecutive tokens instead of the step's ``q_len`` (calibration
            measures the damage of verify rows inside one teacher-forced forward so); None: ``q_len``.
    """

    rule: str
    max_skip: int
    values: torch.Tensor
    group: int | None = None


class VerifySparsity:
    """Verify-time sparsity (LOSSY, opt-in): the slot sparse verification fills (`hf_sparse_verify.sparse.state`).
    Verify steps' attention, replaced MLPs and experts read it from the current step; lossless paths leave the slot
    None. Each query returns None where its layer runs dense; the values returned are fixed device tensors, so
    captured verify graphs stay valid."""

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        view,
        scaling: float,
    ) -> torch.Tensor | None:
        """Block-sparse attention output ``[B, q, H, D]`` of layer ``module.layer_idx``, or None (dense)."""
        return None

    def ffn_tau(self, layer: int) -> torch.Tensor | None:
        """``[]`` float32 channel threshold of layer ``layer``'s FFN, or None (dense)."""
        return None

    def moe_skip(self, layer: int) -> MoESkip | None:
        """Expert skipping of layer ``layer``, or None (every routed expert)."""
        return None

    def drafted(self, counts: torch.Tensor) -> None:
        """Each row's drafted tokens in the coming verify step (``[B]`` int, on the device of the step's tensors),
        given by the loop before the forward and outside captured graphs: verify tokens past ``counts[b]`` are
        filler. Default: not needed."""
