"""Where a model's weights live, and what that rules out: a model spread over several GPUs by an accelerate device
map, or sharded by tensor parallelism (``tp_plan="auto"``, weights as `torch.distributed.tensor.DTensor`).

- A CUDA graph records the work of one device. A model whose decoder layers an accelerate device map spreads over
  several GPUs runs its steps as one graph per device segment (`device_segments`: a run of consecutive layers on one
  GPU, `hf_sparse_verify.generation.engine.segments`), with the hidden state handed between GPUs outside the
  graphs. Offloaded weights and tensor-parallel steps (collectives) run eagerly (`graph_obstacle` says why; the
  loop warns once).
- A tensor-parallel model whose sharded modules our local-shard modules cover (Llama-family attention and gated MLPs,
  vocabulary-sharded embedding and head: `hf_sparse_verify.integrations.tensor_parallel`) runs, for a call, on each
  rank's shards as plain tensors with the collectives as explicit `torch.distributed` calls (`ShardedModule`), so
  its steps are CUDA graphs with the NCCL collectives inside. Other sharded modules (DTensor weights left in the
  forward: `dtensor_weights`) keep transformers' modules, hooks and experts implementation, and run eagerly.
- Ranks of a tensor-parallel model must take the same host decisions: the step times a K policy reads are agreed
  over the ranks (`RankAgreement`).
- Triton launches follow their tensors' device (`hf_sparse_verify.kernels._triton.on_input_device`), so the
  attention kernels run on a device map's every GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from accelerate.hooks import AlignDevicesHook

from . import _compat

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch builds without distributed support
    DTensor = None


class ShardedModule(torch.nn.Module):
    """Base of the modules that stand, during a call, for a tensor-parallel model's sharded modules with plain local
    shards and explicit collectives over ``group`` (`hf_sparse_verify.integrations.tensor_parallel`)."""

    group: object = None


def dtensor_weights(model: torch.nn.Module) -> bool:
    """Whether any weight of ``model`` is a `DTensor` (sharded by transformers' tensor parallelism and run through
    its hooks)."""
    return DTensor is not None and any(isinstance(p, DTensor) for p in model.parameters())


def tensor_parallel(model: torch.nn.Module) -> bool:
    """Whether ``model`` is sharded by tensor parallelism: DTensor weights, or our local-shard modules standing in
    for them during a call (`ShardedModule`)."""
    return dtensor_weights(model) or any(isinstance(m, ShardedModule) for m in model.modules())


def cuda_devices(model: torch.nn.Module) -> list[torch.device]:
    """The CUDA devices ``model``'s weights are on, in index order (several under a multi-GPU device map)."""
    return sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=lambda d: d.index)


@dataclass(frozen=True)
class Segment:
    """A run of consecutive decoder layers on one device: ``layers`` (indices) on ``device``."""

    device: torch.device
    layers: range


def device_segments(model: torch.nn.Module) -> list[Segment] | None:
    """``model``'s decoder layers grouped into runs of consecutive layers on one device (one segment per device
    under a balanced device map; more where the map alternates). None when the decoder layers are not found or a
    layer has weights on two devices."""
    layers = _compat.decoder_layers(model)
    if layers is None or len(layers) == 0:
        return None
    placed = []
    for layer in layers:
        devices = {p.device for p in layer.parameters()}
        if len(devices) != 1:
            return None
        placed.append(devices.pop())
    segments: list[Segment] = []
    first = 0
    for i in range(1, len(placed) + 1):
        if i == len(placed) or placed[i] != placed[first]:
            segments.append(Segment(placed[first], range(first, i)))
            first = i
    return segments


def spans_gpus(model: torch.nn.Module) -> bool:
    """Whether ``model``'s weights are on several GPUs (and nowhere else): its steps run per device segment."""
    placed = {p.device for p in model.parameters()}
    return len(placed) > 1 and all(d.type == "cuda" for d in placed)


def graph_obstacle(model: torch.nn.Module) -> str | None:
    """Why the steps of ``model`` cannot run on CUDA graphs (None when they can: on one GPU as one graph per step,
    over several GPUs as one graph per device segment)."""
    if dtensor_weights(model):
        return (
            "is tensor-parallel with sharded modules our local-shard modules do not cover (transformers' hooks run "
            "its collectives through DTensor)"
        )
    placed = {p.device for p in model.parameters()}
    devices = sorted((d for d in placed if d.type == "cuda"), key=lambda d: d.index)
    elsewhere = sorted({d.type for d in placed} - {"cuda"})
    if devices and elsewhere:
        return f"has weights on {' and '.join(elsewhere)} beside the GPU (offloaded layers run outside a CUDA graph)"
    if len(devices) > 1 and device_segments(model) is None:
        return (
            f"spans {len(devices)} GPUs and its decoder layers do not form runs on one device each (a layer split "
            "over two GPUs, or no decoder layers found), so its steps cannot be captured per device"
        )
    return None


def _tp_group(model: torch.nn.Module):
    """The process group ``model``'s weights are sharded over (its first DTensor's mesh, or its local-shard modules'
    group)."""
    for p in model.parameters():
        if isinstance(p, DTensor):
            return p.device_mesh.get_group()
    for m in model.modules():
        if isinstance(m, ShardedModule):
            return m.group
    raise ValueError("the model is not tensor-parallel")


@functools.cache
def _host_group(ranks: tuple[int, ...]):
    import torch.distributed as dist

    return dist.new_group(ranks=list(ranks), backend="gloo")


class Agreed:
    """Values agreed over tensor-parallel ranks (`RankAgreement.start`): `values` waits for the exchange."""

    def __init__(self, values, work=None):
        self._values = values
        self._work = work

    @property
    def pending(self) -> bool:
        """Whether the values are still being exchanged between ranks."""
        return self._work is not None

    def values(self) -> tuple[float, ...]:
        if self._work is not None:
            self._work.wait()
            self._work = None
            self._values = tuple(self._values.tolist())
        return tuple(self._values)


class RankAgreement:
    """Host values that steer the loop (the step seconds the utility K policy reads) must be equal on every
    tensor-parallel rank: ranks that pick different K run different widths, and their collectives mismatch. `seconds`
    returns the largest value over the ranks; off tensor parallelism it returns its argument. `start` exchanges them
    in the background: the loop hands a step's outcome to the policy at the next step, after launching its verify,
    so no step waits on the host exchange.

    The all-reduce runs on the host (a gloo group over the model's ranks, made once; no device synchronisation)
    when the model's group is gloo or spans the whole world; otherwise on the device, which adds one readback per
    step."""

    def __init__(self, model: torch.nn.Module):
        self.group = None
        self.device = torch.device("cpu")
        if not tensor_parallel(model):
            return
        import torch.distributed as dist

        group = _tp_group(model)
        ranks = tuple(dist.get_process_group_ranks(group))
        if len(ranks) < 2:
            return
        if dist.get_backend(group) == "gloo":
            self.group = group
        elif len(ranks) == dist.get_world_size():
            self.group = _host_group(ranks)
        else:
            self.group = group
            self.device = next(p.device for p in model.parameters() if p.device.type != "meta")

    def start(self, *values: float) -> Agreed:
        """Each value's maximum over the ranks, exchanged in the background (an asynchronous all-reduce): the step
        that offers its times goes on, and a later `Agreed.values` waits for what has long arrived. Off tensor
        parallelism the values are returned as given."""
        if self.group is None:
            return Agreed(values)
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        return Agreed(t, dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True))

    def seconds(self, *values: float) -> tuple[float, ...]:
        """Each value's maximum over the ranks (one all-reduce for all of them)."""
        if self.group is None:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return tuple(t.tolist())


def moves_inputs_only(module: torch.nn.Module) -> bool:
    """Whether ``module`` and every module below it are either unhooked or hooked by accelerate only to move their
    inputs to the device all their weights are already on: an ``AlignDevicesHook`` without offload, without
    ``io_same_device``, executing where the weights are (``dispatch_model`` puts one on every submodule of a block,
    `accelerate.hooks.attach_execution_device_hook`). Inside a decoder layer, whose own hook has moved the hidden
    state to its device, such hooks do nothing, and a replacement may drop them."""
    for m in module.modules():
        hook = getattr(m, "_hf_hook", None)
        params = [*m.parameters(recurse=False), *m.buffers(recurse=False)]
        if any(p.device.type == "meta" for p in params):
            return False
        if hook is None:
            continue
        if (
            type(hook) is not AlignDevicesHook
            or hook.offload
            or hook.io_same_device
            or hook.weights_map is not None
        ):
            return False
        where = hook.execution_device
        where = torch.device("cuda", where) if isinstance(where, int) else torch.device(where)
        if any(p.device != where for p in params):
            return False
    return True


def swappable(module: torch.nn.Module, in_layer: bool = False) -> bool:
    """Whether one of our module replacements may stand in for ``module`` during a call: not when accelerate hooks
    it (``_hf_hook``, set by ``accelerate.hooks.add_hook_to_module``: the hook moves inputs to the module's device
    and streams offloaded weights in, and a replacement carries no hook), nor when a weight of it is on the meta
    device (offloaded); except, for a module inside a decoder layer (``in_layer``), hooks that only move inputs
    to the device its weights are on (`moves_inputs_only`: a device map over several GPUs without offload)."""
    if in_layer and moves_inputs_only(module):
        return (
            True  # inside a decoder layer (``in_layer``), hooks that only move inputs to the weights' device
        )
    return not hasattr(module, "_hf_hook") and all(p.device.type != "meta" for p in module.parameters())
