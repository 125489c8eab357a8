"""`GatedMLP`: the Llama-family gated MLP ``down(silu(gate(x)) * up(x))`` on the kernels of
`hf_sparse_verify.kernels.sparse_ffn`, with the sparse FFN of verification (the sparse-verification paper §3.4).

Per forward, from the running step (`hf_sparse_verify.step.current_step`):

- verify steps whose `VerifySparsity` gives a threshold ``tau`` for this layer: the sparse path. ``x`` is ``[B, q,
  H]``; row ``b`` keeps channel ``i`` when ``|silu(gate(x))_i|`` reaches ``tau`` for one of its ``q`` tokens, and
  only the rows of ``up`` and ``down`` that some row keeps are read (Triton where it runs: two or three launches, for
  steps of at most `SPARSE_KERNEL_MAX_BATCH` batch rows; larger batches, whose rows together keep almost every
  channel, and CPUs compute the same result densely with the skipped channels zeroed). The gate projection
  runs inside the kernel, so forward hooks on ``gate_proj`` do not see sparse steps.
- everything else: dense. On CUDA, for steps of at most `hf_sparse_verify.kernels.sparse_ffn.op.FUSED_MAX_ROWS` token rows, the fused ``silu(gate) * up``
  kernel plus a torch matmul for ``down``; elsewhere the original module's arithmetic, so CPU results are bitwise
  what transformers computes.

Memory: the sparse down kernel reads ``down`` one kept channel at a time, which wants ``down_proj.weight.T`` as contiguous
rows. With ``down_copy=True`` (default) that copy is built on a layer's first sparse step on a CUDA device and kept
for the life of the weight: ``I * H`` elements per layer, as large as ``down_proj`` itself (a third of the MLP
weights; 117 MiB per layer, 3.7 GiB in all for Llama-3.1-8B in bf16). Build it before capturing CUDA graphs (run
one eager sparse verify step first). ``down_copy=False`` reads the transposed view of ``down_proj.weight`` in place:
no extra memory, scattered reads.
"""

from __future__ import annotations

import weakref

import torch

from ..kernels._triton import compiled_on
from ..kernels.sparse_ffn import channel_mask_naive, gated_act, sparse_ffn
from ..kernels.sparse_ffn import op as ffn_op
from ..step import current_step
from .low_bit_linear import LOW_BIT_LAYERS, stacked_whole

#: MLP classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (checked against transformers
#: 5.23.0's source; Qwen2MoeMLP / Qwen3MoeMLP are the shared expert and the dense layers of the MoE models). An
#: instance is replaced only when its projections have no bias and its activation is SiLU (`replaceable_mlp`).
REPLACEABLE = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Qwen2MoeMLP", "Qwen3MoeMLP"})
#: the sparse FFN kernels run for verify steps of at most this many batch rows; larger batches compute the same
#: masked MLP with dense reads (torch matmuls, the skipped channels zeroed). The kernels read the union of the rows'
#: kept channels, and with a few rows that union is almost every channel: on an H200 (8B MLP, 16 verify tokens per
#: row, 50% of each row's channels skipped; `benchmarks/sweep_sparse_ffn.py`, `results/sweep_sparse_ffn.json (record tiles)`)
#: 8 rows keep 14290 of 14336 channels between them and the kernels took 202-298 us against 113 us for the dense MLP,
#: while one row took 80-95 us against 89.
SPARSE_KERNEL_MAX_BATCH = 1
#: activation classes that compute ``F.silu`` (transformers' ``ACT2FN["silu"]`` / ``["swish"]``)
SILU_ACTIVATIONS = frozenset({"SiLUActivation", "SiLU"})


def replaceable_mlp(module: torch.nn.Module) -> bool:
    """Whether `GatedMLP` computes exactly what ``module`` computes: an allow-listed class with SiLU, ``nn.Linear``
    projections and no biases (``LlamaMLP`` with ``mlp_bias=True`` or another ``hidden_act`` stays as it is)."""
    if type(module).__name__ not in REPLACEABLE:
        return False
    projections = (module.gate_proj, module.up_proj, module.down_proj)
    if not all(type(p) is torch.nn.Linear for p in projections):  # e.g. a low-bit draft's LowBitLinear
        return False
    return type(module.act_fn).__name__ in SILU_ACTIVATIONS and all(p.bias is None for p in projections)


def replaceable_low_bit_mlp(module: torch.nn.Module) -> bool:
    """Whether `LowBitGatedMLP` computes what ``module`` computes: an allow-listed class with SiLU whose ``gate_proj``
    and ``up_proj`` are together one stacked low-bit layer (`low_bit_copy`), ``down_proj`` low-bit, no biases."""
    if type(module).__name__ not in REPLACEABLE:
        return False
    gate, up, down = (getattr(module, p, None) for p in ("gate_proj", "up_proj", "down_proj"))
    if stacked_whole([gate, up]) is None or not isinstance(down, LOW_BIT_LAYERS):
        return False
    return type(module.act_fn).__name__ in SILU_ACTIVATIONS and all(p.bias is None for p in (gate, up, down))


class LowBitGatedMLP(torch.nn.Module):
    """Stand-in for the gated MLP of a low-bit draft copy (`replaceable_low_bit_mlp`): gate and up in one low-bit
    launch of their stacked layer, then ``down(act(gate) * up)`` as the original computes it. Shares the original's
    projections."""

    reads = ("gate_proj", "up_proj", "down_proj", "act_fn")

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        if not replaceable_low_bit_mlp(original):
            raise ValueError(
                f"{type(original).__name__} is not a bias-free SiLU gated MLP of {sorted(REPLACEABLE)} whose gate "
                "and up are one stacked low-bit layer; leave it in place"
            )
        self.gate_proj, self.up_proj = original.gate_proj, original.up_proj
        self.down_proj, self.act_fn = original.down_proj, original.act_fn
        self._gate_up = stacked_whole([self.gate_proj, self.up_proj])
        self._inner = self.gate_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate_up(x).split(self._inner, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class GatedMLP(torch.nn.Module):
    """Stand-in for a Llama-family MLP of decoder layer ``layer_idx``; shares the original's projections (same
    state-dict keys, no weight copied except the optional transposed ``down``, see the module docstring).

    Args:
        original: an MLP for which `replaceable_mlp` holds.
        layer_idx: index of the decoder layer that owns it (the layer `VerifySparsity.ffn_tau` is asked about).
        down_copy: read ``down`` from a contiguous transposed copy on CUDA (faster; costs one more ``down_proj``
            of memory) instead of a strided view. Default True.
    """

    reads = ("gate_proj", "up_proj", "down_proj", "act_fn")

    def __init__(self, original: torch.nn.Module, layer_idx: int, *, down_copy: bool = True):
        super().__init__()
        if not replaceable_mlp(original):
            raise ValueError(
                f"{type(original).__name__} is not a bias-free SiLU gated MLP of {sorted(REPLACEABLE)}; leave it "
                "in place"
            )
        self.gate_proj = original.gate_proj
        self.up_proj = original.up_proj
        self.down_proj = original.down_proj
        self.act_fn = original.act_fn
        self.layer_idx = layer_idx
        self.down_copy = down_copy

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step = current_step(required=False)
        sparsity = step.sparsity() if step is not None else None
        tau = sparsity.ffn_tau(self.layer_idx) if sparsity is not None else None
        if tau is not None:
            return self.sparse(x, tau)
        if compiled_on(x.device) and x.numel() <= ffn_op.FUSED_MAX_ROWS * x.shape[-1]:
            return self.down_proj(gated_act(x, self.gate_proj.weight, self.up_proj.weight))
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def sparse(self, x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
        """The sparse FFN of a verify step: ``x`` ``[B, q, H]``, ``tau`` ``[]`` float32 -> ``[B, q, H]``."""
        if x.dim() != 3:
            raise ValueError(
                f"the sparse FFN of layer {self.layer_idx} needs its input as [batch rows, verify tokens, hidden]; "
                f"got {tuple(x.shape)}"
            )
        if compiled_on(x.device) and x.shape[0] > SPARSE_KERNEL_MAX_BATCH:  # same result, dense reads
            act = self.act_fn(self.gate_proj(x))  # [B, q, I]
            keep = channel_mask_naive(act, tau)  # [B, I]
            return self.down_proj(torch.where(keep[:, None, :], act * self.up_proj(x), 0))
        weight = self.down_proj.weight  # [H, I]
        down_t = transposed_copy(weight) if self.down_copy and x.device.type == "cuda" else weight.T
        return sparse_ffn(x, self.gate_proj.weight, self.up_proj.weight, down_t, tau)


def transposed_copy(weight: torch.Tensor) -> torch.Tensor:
    """``weight.T`` as a contiguous tensor, built once per weight (rebuilt if the weight is changed in place) and
    freed with it."""
    key = id(weight)
    entry = _TRANSPOSED.get(key)
    if entry is None or entry[0]() is not weight or entry[1] != weight._version:
        with torch.no_grad():
            copy = weight.detach().T.contiguous()
        # tensors compare elementwise, so they cannot key a WeakKeyDictionary: key by id, drop the entry with the weight
        entry = (weakref.ref(weight, lambda _, key=key: _TRANSPOSED.pop(key, None)), weight._version, copy)
        _TRANSPOSED[key] = entry
    return entry[2]


#: id(down weight) -> (weak reference to it, its version when copied, the contiguous transposed copy)
_TRANSPOSED: dict[int, tuple] = {}
