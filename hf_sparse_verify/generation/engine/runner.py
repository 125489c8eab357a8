"""`ModelRunner`: one model plus its `SpecCache`, run one step at a time (used for the target and draft models),
eagerly or by replaying captured CUDA graphs (`graphs.StepGraphs`).

Positions come as device tensors (``start``: the cache slot of each row's first new token), so a step needs no
host value except the host-side bound ``kv_len`` that eager backends slice with; captured steps ignore it.
"""

from __future__ import annotations

import torch

from ..._compat import (
    CACHE_KWARG,
    forward_on,
    hybrid_layer_indices,
    kv_shared_sources,
    last_logit,
    recurrent_layer_indices,
)
from ..._logging import warn_once
from ...attention import SpecCache
from ...placement import device_segments, graph_obstacle, spans_gpus
from ...step import KVSelection, Phase, ScoreCollection, StepContext, VerifySparsity, step_scope
from .graphs import StepGraphs
from .segments import SegmentGraphs
from .state import to_device

#: tokens (rows x prompt tokens) one prefill forward takes; longer prompts are prefilled in chunks, so activations
#: stay bounded (a 16 x 16K prefill of the 8B shape in one forward does not fit next to its cache on an 80 GB GPU)
PREFILL_TOKENS = 16384


class ModelRunner:
    """Runs ``model`` on ``[B, W]`` tokens written at per-row cache slots, through the ``"sparse_verify"``
    attention.

    Args:
        model: a causal LM already switched to the ``"sparse_verify"`` attention.
        batch: rows.
        capacity: KV slots per row.
        out_device: where float32 logits are returned.
        backend: attention backend name.
    """

    def __init__(self, model, batch: int, capacity: int, out_device, backend: str = "reference"):
        self.model = model
        self.cache = SpecCache(
            model.config.get_text_config().num_hidden_layers,
            batch,
            capacity,
            recurrent_layers=recurrent_layer_indices(model),
            shared_layers=kv_shared_sources(model),
            hybrid_layers=hybrid_layer_indices(model),
        )
        self.device = model.get_input_embeddings().weight.device
        self.out_device = out_device
        self.backend = backend
        self.pad_t = torch.zeros(batch, dtype=torch.long, device=self.device)  # fixed: graphs read it
        self.pad_host = (0,) * batch  # the same pads on the host (eager prefill steps read them)
        self.graphs: StepGraphs | SegmentGraphs | None = None
        # the model draft steps run, sharing this runner's cache (a low-bit copy of ``model``, set by self-speculative
        # drafters with `SpeculationConfig.draft_weights`); None: ``model``
        self.draft_weights: torch.nn.Module | None = None
        self.use_graphs = False  # set by the loop: steps are captured after the prefill
        self.graph_obstacle = graph_obstacle(model)  # offloaded weights or tensor parallelism: eager steps
        # over several GPUs: one graph per device segment (the model's decoder layers are `SegmentLayer`s)
        self.segments = device_segments(model) if spans_gpus(model) else None

    def set_padding(self, pad: list[int]) -> None:
        """Left padding of this call's rows (copied into the fixed buffer that captured steps read)."""
        self.pad_t.copy_(to_device(pad, self.device))
        self.pad_host = tuple(int(p) for p in pad)

    @property
    def no_padding(self) -> bool:
        return max(self.pad_host) == 0

    def can_capture(self) -> bool:
        """CUDA graphs need a CUDA model and the ``triton`` backend (whose kernels read lengths on the device); a
        model with offloaded weights or sharded by tensor parallelism runs eager steps (`graph_obstacle`), one over
        several GPUs one graph per device segment."""
        return self.device.type == "cuda" and self.backend == "triton" and self.graph_obstacle is None

    def capture(self, widths, phase: Phase = Phase.VERIFY, **slots) -> bool:
        """Capture one CUDA graph per width in ``widths`` (after the prefill) for ``phase`` steps with the given
        step slots; steps already captured are kept. On failure warn once, drop every graph (eager steps) and
        return False."""
        if not self.can_capture():
            return False
        try:
            if self.graphs is None:
                self.graphs = SegmentGraphs(self, self.segments) if self.segments else StepGraphs(self)
            self.graphs.add(widths, Phase(phase), slots)
        except Exception as err:  # capture can fail inside any module: fall back, say why once
            self.graphs = None
            if self.device.type == "cuda":
                for segment in self.segments or ():
                    torch.cuda.synchronize(segment.device)
                torch.cuda.synchronize(self.device)
            warn_once(
                type(self.model).__name__,
                f"hf_sparse_verify: CUDA-graph capture of {type(self.model).__name__} failed "
                f"({type(err).__name__}: {err}); running eager steps instead. Set "
                "SpeculationConfig(cuda_graphs=False) to skip the attempt.",
            )
            return False
        return True

    def prefill(self, ids: torch.Tensor, chunk_tokens: int | None = None, **last_slots) -> torch.Tensor:
        """Write the prompts ``ids`` ``[B, T]`` at slots ``0 .. T - 1`` in chunks of at most ``chunk_tokens``
        tokens per forward (chunks aligned to the end, so the last one is whole); ``last_slots`` (a score
        collection, say) go to the last chunk only. Returns the float32 logits of the last position ``[B, 1, V]``."""
        batch, length = ids.shape
        chunk_tokens = PREFILL_TOKENS if chunk_tokens is None else chunk_tokens
        chunk = max(16, chunk_tokens // batch)
        starts = list(range(length - chunk, 0, -chunk))[::-1]
        bounds = list(zip([0, *starts], [*starts, length]))
        for first, end in bounds:
            start = torch.full((batch,), first, dtype=torch.long, device=self.device)
            last = end == length
            logits = self.forward(
                ids[:, first:end],
                start,
                Phase.PREFILL,
                kv_len=end,
                uniform_start=True,
                logits_to_keep=last_logit(self.model),
                **(last_slots if last else {}),
            )
        return logits

    def run_model(self, ids: torch.Tensor, step: StepContext, logits_to_keep: int | torch.Tensor = 0) -> torch.Tensor:
        """One forward of ``step``; the model's logits as they come."""
        positions = (step.start - step.pad)[:, None] + torch.arange(step.q_len, device=self.device)
        model = (
            self.draft_weights if step.phase is Phase.DRAFT and self.draft_weights is not None else self.model
        )
        if self.segments is not None:  # the step's first piece records on this GPU: no move to another first
            model = forward_on(model, self.device)
        with step_scope(step):
            out = model(
                input_ids=ids,
                position_ids=positions.clamp_min(0),
                **{CACHE_KWARG: self.cache},
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        return out.logits

    def forward(
        self,
        ids: torch.Tensor,
        start: torch.Tensor,
        phase: Phase,
        *,
        kv_len: int,
        uniform_start: bool = False,
        logits_to_keep: int | torch.Tensor = 0,
        kv_selection: KVSelection | None = None,
        scores: ScoreCollection | None = None,
        verify_sparsity: VerifySparsity | None = None,
    ) -> torch.Tensor:
        """Write ``ids`` ``[B, W]`` at slots ``start[b] ..`` (``[B]`` on the device) of each row; float32 logits
        ``[B, W or keep, V]``. ``kv_len`` is the host-side bound ``max(start) + W``; ``uniform_start`` says every
        row starts at the same slot (both only matter to eager steps)."""
        width = ids.shape[1]
        slots = {"kv_selection": kv_selection, "scores": scores, "verify_sparsity": verify_sparsity}
        phase = Phase(phase)
        whole = isinstance(logits_to_keep, int) and not logits_to_keep  # every position: a step graphs hold
        entry = self.graphs.find(phase, width, slots) if self.graphs and whole else None
        if entry is not None:
            logits = self.graphs.replay(entry, ids.to(self.device), start)
            return logits.to(self.out_device, torch.float32, copy=True)
        self.cache.check_fits(kv_len)
        step = StepContext(
            phase,
            start.to(self.device),
            self.pad_t,
            q_len=width,
            kv_len=kv_len,
            backend=self.backend,
            no_padding=self.no_padding,
            uniform_start=uniform_start,
            host_pad=self.pad_host if phase is Phase.PREFILL else None,
            **slots,
        )
        logits = self.run_model(ids.to(self.device), step, logits_to_keep)
        return logits.to(self.out_device, torch.float32)
