"""Tensor-parallel models on the fast path: for a call, each rank's shards as plain tensors, with the collectives as
explicit `torch.distributed` calls, so that our fused modules and kernels run on the local heads and channels and a
step is one CUDA graph with its NCCL collectives inside.

transformers' tensor parallelism (``tp_plan="auto"``) keeps sharded weights as `DTensor` and installs per-module
forwards that wrap inputs and outputs as DTensors and run the collectives. Every op then pays DTensor dispatch on the
host (an 8B step: 75 ms against a 1.85 ms floor on two H200s, `results/tensor_parallel.json`), our modules, which
read plain weights, cannot stand in, and nothing is captured. `local_shard_swaps` plans, for a model whose every
DTensor weight is in a module it covers, module replacements that compute what transformers' styles compute:

- a Linear sharded on its output features (``colwise``: q/k/v, gate/up) becomes an ``nn.Linear`` over the local
  rows (its local heads or channels); the attention or MLP above it then sees an ordinary module, and
  `FusedQKVAttention` / `GatedMLP` take it as on one GPU;
- the attention or MLP whose last projection is sharded on its input features (``rowwise``: ``o_proj``,
  ``down_proj``, no bias) is wrapped by `ReduceOutput`, which all-reduces the module's output (the partial sums
  over the local heads or channels), as ``RowwiseParallel`` does after that projection;
- the routed experts of a MoE block (`decoder_layer.FUSABLE_MOE`: router, then experts) sharded on their intermediate
  channels (``packed_colwise`` ``gate_up_proj``, ``rowwise`` ``down_proj``: every rank holds every expert's share
  of channels) become a copy of the experts module over the local shards (`local_experts`), and the block is
  wrapped by `ReduceOutput`; the router is replicated, so every rank routes alike, and the experts implementation
  (our fused Triton experts on CUDA) runs on the local channels;
- the input embedding sharded over the vocabulary (``embedding_rowwise``) becomes `VocabShardEmbedding`: the local
  rows' lookup, zero for ids outside them, all-reduced (exact: one term is non-zero);
- the output embedding sharded over the vocabulary (``colwise_gather_output`` / ``colwise_rep``) becomes
  `GatherLinear`: the local logits, all-gathered along the vocabulary.

The sums are those of transformers' path (the same partials, all-reduced by the same backend), so greedy output is
plain ``generate``'s on the same shards. Anything else sharded (MoE experts, biases of row-parallel projections,
uneven shards, experts sharded over experts, layers of other families) leaves the model on transformers' modules
(`local_shard_swaps` says why).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..placement import DTensor, ShardedModule
from . import decoder_layer, mlp, qkv_attention


def _placement(weight, packed: bool = False) -> int | None:
    """The dimension a DTensor weight is sharded on, in equal pieces, over a one-dimensional mesh (None: not sharded
    that way). ``packed``: the dimension holds two halves (gate, up), each sharded (``_StridedShard`` with split
    factor 2), so the local piece is the rank's share of each half, in order."""
    if not isinstance(weight, DTensor) or weight.device_mesh.ndim != 1:
        return None
    (placement,) = weight.placements
    size = weight.device_mesh.size()
    if packed:
        if type(placement).__name__ != "_StridedShard" or placement.split_factor != 2:
            return None
        size *= 2
    elif not placement.is_shard():
        return None
    if weight.shape[placement.dim] % size != 0:
        return None  # uneven shards: the gathers below need equal pieces
    return placement.dim


def _local(param) -> torch.nn.Parameter | None:
    if param is None:
        return None
    local = param.to_local() if isinstance(param, DTensor) else param
    return torch.nn.Parameter(local.detach(), requires_grad=False)


def local_linear(linear: torch.nn.Linear) -> torch.nn.Linear:
    """An ``nn.Linear`` over ``linear``'s local shard (its weight and bias as plain tensors; nothing copied)."""
    weight = _local(linear.weight)
    local = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, device="meta")
    local.weight = weight
    if linear.bias is not None:
        local.bias = _local(linear.bias)
    return local


def local_experts(experts: torch.nn.Module) -> torch.nn.Module:
    """A copy of the experts module ``experts`` (same class, same attributes) whose weights are its local shards:
    ``gate_up_proj`` the rank's gate channels then its up channels, ``down_proj`` the same channels' columns.
    transformers' tensor-parallel forward, an attribute of the sharded original, is not carried over."""
    local = copy.copy(experts)
    local.__dict__.pop("forward", None)
    local._parameters = {name: _local(p) for name, p in experts._parameters.items()}
    local._buffers = dict(experts._buffers)
    local._modules = dict(experts._modules)
    if hasattr(local, "intermediate_dim"):
        local.intermediate_dim = local.down_proj.shape[-1]
    return local


class ReduceOutput(ShardedModule):
    """Runs ``module`` (whose output is partial sums over the local shards) and all-reduces its output (the first
    element of a tuple) in place over ``group``.

    Args:
        module: an attention or MLP whose last projection is row-parallel without bias.
        group: the tensor-parallel process group.
    """

    def __init__(self, module: torch.nn.Module, group):
        super().__init__()
        self.module = module
        self.group = group
        for name in ("layer_idx", "is_causal"):  # read on attention modules by transformers' forwards
            if hasattr(module, name):
                setattr(self, name, getattr(module, name))

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        dist.all_reduce(out[0] if isinstance(out, tuple) else out, group=self.group)
        return out


class VocabShardEmbedding(ShardedModule):
    """An embedding whose rows (the vocabulary) are sharded: the local rows' lookup, zero elsewhere, all-reduced."""

    def __init__(self, original: torch.nn.Embedding, group):
        super().__init__()
        self.weight = _local(original.weight)
        self.group = group
        self.rows = self.weight.shape[0]
        self.start = original.weight.device_mesh.get_local_rank() * self.rows
        self.padding_idx = original.padding_idx
        self.num_embeddings, self.embedding_dim = original.num_embeddings, original.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight) * inside[..., None].to(
            self.weight.dtype
        )
        dist.all_reduce(out, group=self.group)
        return out


class GatherLinear(ShardedModule):
    """A Linear sharded on its output features whose full output is needed (the vocabulary head): the local
    output, all-gathered along the last dimension."""

    def __init__(self, original: torch.nn.Linear, group):
        super().__init__()
        self.linear = local_linear(original)
        self.group = group
        self.world = dist.get_world_size(group)
        self.in_features, self.out_features = original.in_features, original.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = self.linear(x).contiguous()
        gathered = local.new_empty((self.world * local.shape[0], *local.shape[1:]))  # the pieces along dim 0
        _all_gather(gathered, local, group=self.group)
        pieces = gathered.view(self.world, *local.shape)
        return pieces.movedim(0, -2).reshape(*local.shape[:-1], self.world * local.shape[-1])


#: torch 2.13 names it ``all_gather_single`` (the old name warns); earlier releases have only the old name
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _group(weight):
    return weight.device_mesh.get_group()


def _attention_swaps(module) -> list | None:
    if not qkv_attention.replaceable_attention(module) or module.o_proj.bias is not None:
        return None
    if [_placement(getattr(module, p).weight) for p in ("q_proj", "k_proj", "v_proj", "o_proj")] != [
        0,
        0,
        0,
        1,
    ]:
        return None
    size = module.q_proj.weight.device_mesh.size()
    heads = module.q_proj.out_features // module.head_dim
    kv_heads = module.k_proj.out_features // module.head_dim
    if heads % size or kv_heads % size:
        return None
    return [(module, p, getattr(module, p), local_linear(getattr(module, p))) for p in ("q_proj", "k_proj",
            "v_proj", "o_proj")]  # fmt: skip


def _mlp_swaps(module) -> list | None:
    if not mlp.replaceable_mlp(module):
        return None
    if [_placement(getattr(module, p).weight) for p in ("gate_proj", "up_proj", "down_proj")] != [0, 0, 1]:
        return None
    return [(module, p, getattr(module, p), local_linear(getattr(module, p))) for p in ("gate_proj", "up_proj",
            "down_proj")]  # fmt: skip


def _moe_swaps(module) -> list | None:
    experts = getattr(module, "experts", None)
    if type(module).__name__ not in decoder_layer.FUSABLE_MOE or experts is None:
        return None
    params = dict(experts.named_parameters(recurse=False))
    if set(params) != {"gate_up_proj", "down_proj"} or any(m for m in experts.children() if
                                                           any(m.parameters())):  # fmt: skip
        return None
    if _placement(params["gate_up_proj"], packed=True) != 1 or _placement(params["down_proj"]) != 2:
        return None
    size = params["down_proj"].device_mesh.size()
    if params["down_proj"].shape[2] % size or any(isinstance(p, DTensor) for p in module.gate.parameters()):
        return None
    return [(module, "experts", experts, local_experts(experts))]


def local_shard_swaps(model: torch.nn.Module) -> tuple[list, str | None]:
    """The replacements that put a tensor-parallel ``model`` on its local shards (parents before children, as
    `hf_sparse_verify.integrations.switch` applies swaps), or ``([], reason)`` where a sharded module is not covered
    (the model then keeps transformers' modules). ``([], None)`` for a model with no DTensor weights."""
    if DTensor is None or not any(isinstance(p, DTensor) for p in model.parameters()):
        return [], None
    if not dist.is_initialized():
        return [], "torch.distributed is not initialised"
    swaps: list = []
    inner: list = []
    covered: set[int] = set()
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    for parent in model.modules():
        for name, child in parent.named_children():
            found = None
            if child is embed and type(child) is torch.nn.Embedding and _placement(child.weight) == 0:
                found = VocabShardEmbedding(child, _group(child.weight))
            elif child is head and type(child) is torch.nn.Linear and _placement(child.weight) == 0:
                if child.bias is None:
                    found = GatherLinear(child, _group(child.weight))
            else:
                parts = _attention_swaps(child) if hasattr(child, "o_proj") else None
                parts = parts or (_mlp_swaps(child) if hasattr(child, "down_proj") else None)
                parts = parts or (_moe_swaps(child) if hasattr(child, "experts") else None)
                if parts:
                    inner.extend(parts)
                    found = ReduceOutput(child, _group(next(parts[-1][2].parameters())))
            if found is not None:
                swaps.append((parent, name, child, found))
                covered.update(id(p) for p in child.parameters())
    left = [n for n, p in model.named_parameters() if isinstance(p, DTensor) and id(p) not in covered]
    if left:
        return (
            [],
            f"sharded weights our local-shard modules do not cover: {left[:4]}{' ...' if len(left) > 4 else ''}",
        )
    return swaps + inner, None
