"""`SpecCache`: a preallocated KV cache with per-row lengths and O(1) rollback.

A subclass of transformers' `Cache`, so unmodified attention modules call its ``update``. Each layer owns
``[B, H_kv, capacity, D]`` key and value buffers, allocated on the device of the first keys it receives (so
each layer's buffers live on that layer's GPU under an accelerate device map). The decoding loop says where the
next tokens go through the running `StepContext` (its per-row ``start`` slots, see `hf_sparse_verify.step`); ``update``
scatters the new keys and values there and returns the whole buffers. Which slots are valid is the loop's
business: rolling back rejected drafts is moving a row's length back, with no copy and no ``torch.cat``.
``update`` never synchronises with the host, so steps can later be captured in CUDA graphs.

Sliding-window layers keep the full history too; the window is applied by the attention mask. That costs
memory on long contexts but keeps rollback trivial.

Short-convolution layers of hybrid models (LFM2's ``conv`` layers: a causal depthwise convolution over the last few
inputs) keep their inputs the same way (`SpecConvLayer`): one ``[B, C, capacity]`` buffer of each slot's input, from
which a step reads the window its convolution needs. Their state after any number of accepted drafts is then just
the inputs before the next step's slots, and rolls back as the KV does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin

from ..kernels.cache_write import cache_write
from ..step import current_step


class SpecLayer(CacheLayerMixin):
    """One layer of a `SpecCache`."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SpecCache, layer_idx: int):
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.indexer_keys: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        if batch != self.owner.batch_size:
            raise ValueError(
                f"SpecCache was built for batch {self.owner.batch_size}, got keys of batch {batch}"
            )
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (batch, heads, self.owner.capacity)
        self.keys = torch.zeros(*shape, key_states.shape[-1], dtype=self.dtype, device=self.device)
        self.values = torch.zeros(*shape, value_states.shape[-1], dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write ``key_states``/``value_states`` ``[B, H_kv, q, D]`` at the current step's slots; return the
        full ``[B, H_kv, capacity, D]`` buffers."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        step = current_step()
        if key_states.shape[-2] != step.q_len:
            raise ValueError(
                f"step announced {step.q_len} new tokens, the layer wrote {key_states.shape[-2]}"
            )
        slots = step.on(self.device).query_slots  # [B, q]
        if step.backend == "triton" and key_states.shape == value_states.shape:
            cache_write(self.keys, self.values, key_states, value_states, slots)  # one launch for both
        else:
            index = slots[:, None, :, None]
            self.keys.scatter_(2, index.expand_as(key_states), key_states.to(self.dtype))
            self.values.scatter_(2, index.expand(*value_states.shape), value_states.to(self.dtype))
        return self.keys, self.values

    def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
        """A sparse-attention indexer's keys (DeepSeek-V3.2 and GLM's DSA: ``[B, q, D]``) written at the step's slots,
        as the layer's keys are; returns the ``[B, kv_len, D]`` slots the step reads (the indexer scores every one,
        and its top-k are slot indices)."""
        step = current_step()
        if self.indexer_keys is None:
            batch, _, dim = indexer_key_states.shape
            self.indexer_keys = torch.zeros(
                batch,
                self.owner.capacity,
                dim,
                dtype=indexer_key_states.dtype,
                device=indexer_key_states.device,
            )
        slots = step.on(self.indexer_keys.device).query_slots  # [B, q]
        index = slots[:, :, None].expand(-1, -1, self.indexer_keys.shape[-1])
        self.indexer_keys.scatter_(1, index, indexer_key_states.to(self.indexer_keys.dtype))
        return self.indexer_keys[:, : step.kv_len]

    def direct_write_slots(self, batch: int, q_len: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The ``[B, q]`` slots this step's keys and values go to, for a kernel that writes them into ``keys`` /
        ``values`` itself instead of calling `update` (`hf_sparse_verify.integrations.FusedQKVAttention`: rotary and
        cache write in one launch); None where `update` has to run (buffers not allocated yet, another dtype or
        step length, or a step that is not on the Triton backend)."""
        step = current_step(required=False)
        if step is None or step.backend != "triton" or not self.is_initialized:
            return None
        if step.q_len != q_len or self.dtype != dtype or self.keys.shape[0] != batch:
            return None
        if self.keys.shape != self.values.shape or self.keys.stride() != self.values.stride():
            return None
        return step.on(self.device).query_slots

    @property
    def nbytes(self) -> int:
        """Bytes of its buffers allocated so far: keys and values, and a DSA indexer's keys."""
        held = (self.keys, self.values) if self.is_initialized else ()
        return sum(t.nbytes for t in (*held, self.indexer_keys) if t is not None)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        step = current_step(required=False)
        return step.kv_len if step is not None else self.owner.capacity, 0

    def get_seq_length(self) -> int:
        step = current_step(required=False)
        return 0 if step is None else step.kv_len - step.q_len

    def get_max_length(self) -> int:
        return self.owner.capacity

    def reset(self) -> None:
        if self.is_initialized:
            self.keys.zero_()
            self.values.zero_()
        if self.indexer_keys is not None:
            self.indexer_keys.zero_()


class _PreviousState:
    """``has_previous_state`` of a `SpecConvLayer`: True once a step has tokens before it (the host bound
    ``kv_len - q_len``), for every state index; read by transformers' `Cache.get_conv_state` /
    ``get_recurrent_state``."""

    def __init__(self, layer: SpecConvLayer):
        self.layer = layer

    def __getitem__(self, state_idx: int) -> bool:
        step = current_step(required=False)
        return step is not None and step.kv_len - step.q_len > 0 and self.layer.ring is not None

    def values(self):
        return [self[0]]


class _StateBefore:
    """``recurrent_states`` of a `SpecConvLayer`: index 0 is each row's state after the slot before the current
    step's first token, ``[B, ...]``, read from the layer's ring."""

    def __init__(self, layer: SpecConvLayer):
        self.layer = layer

    def __getitem__(self, state_idx: int) -> torch.Tensor:
        ring = self.layer.ring
        view = current_step().on(ring.device)
        rows = torch.arange(ring.shape[0], device=ring.device)
        state = ring[rows, (view.start - 1).remainder(ring.shape[1])]  # a copy
        self.layer.lent = state  # a mixer may advance it in place (`SpecConvLayer.settle`)
        return state


class SpecConvLayer(LinearAttentionCacheLayerMixin):
    """A recurrent layer of a hybrid model in a `SpecCache`: its convolution inputs and its recurrent state after
    each of the last slots, in rings (memory independent of the context length).

    - **Convolution** (LFM2's ``conv`` layers, and the short convolution before a linear-attention layer):
      ``update_conv_state`` writes the step's inputs ``[B, C, W]`` at the step's slots into a ring of
      ``RING + kernel - 1`` slots per row (not one per cache slot) and returns the window the model's causal
      convolution runs over: the ``kernel - 1`` inputs before each row's first new slot, then the new ones (``[B, C, kernel - 1 + W]``; slots of the row's left padding, and before slot 0,
      read as zeros, as plain ``generate`` zeroes padded inputs). The model keeps the last ``W`` outputs. The layer
      says it records its past (``record_past``), so models take this path at every step instead of updating a
      state in place; a rejected draft's input is simply overwritten by the next step.
    - **Recurrent state** (a linear-attention or state-space layer): ``update_recurrent_state`` keeps the state it
      is given as the state after the step's last slot, in a ring of `RING` slots per row; ``get_recurrent_state``
      reads the state after the slot before the step. A layer that runs a verify step one token at a time
      (`hf_sparse_verify.integrations.recurrent.TokenByToken`) leaves the state after every token there, so the
      next step, which starts after the last accepted token, finds its state without any rollback. A mixer whose
      one-token form advances the state it was given in place and hands the cache nothing (Mamba's) has that
      state kept by `settle`, which its wrapper calls after each call.
    """

    is_compileable = True
    is_sliding = False
    #: recurrent states kept per row: more than the widest step (the largest K + 1) plus one
    RING = 32

    def __init__(self, owner: SpecCache, layer_idx: int):
        super().__init__(number_of_states=1)
        self.owner = owner
        self.layer_idx = layer_idx
        self.record_past = True
        self.inputs: torch.Tensor | None = None
        self.ring: torch.Tensor | None = None
        self.lent: torch.Tensor | None = None  # the state last given out by `get_recurrent_state`, until kept
        self.has_previous_state = _PreviousState(self)
        self.recurrent_states = _StateBefore(self)
        self.is_initialized = False

    def lazy_initialization(
        self, conv_states=None, recurrent_states=None, state_idx: int = 0, conv_kernel_size: int = 1, **kwargs
    ) -> None:
        batch, channels = conv_states.shape[:2]
        if batch != self.owner.batch_size:
            raise ValueError(
                f"SpecCache was built for batch {self.owner.batch_size}, got conv inputs of batch {batch}"
            )
        self.dtype, self.device = conv_states.dtype, conv_states.device
        slots = self.RING + conv_kernel_size - 1  # the widest step plus the inputs before it
        self.inputs = torch.zeros(batch, channels, slots, dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update_conv_state(
        self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None, **kwargs
    ) -> torch.Tensor:
        """Write the step's convolution inputs ``[B, C, W]``; return ``[B, C, kernel - 1 + W]`` to convolve.

        The inputs are kept in a ring of ``RING + kernel - 1`` slots per row (slot ``s`` at ``s mod`` that), not one
        per cache slot: a step reads only the ``kernel - 1`` inputs before its first slot, and no step is wider than
        ``RING`` (`hf_sparse_verify.integrations.recurrent`), so nothing a later step reads is overwritten first,
        whatever the step accepted. A step wider than the ring (a prefill) keeps its last inputs."""
        if conv_kernel_size is None:
            raise ValueError(
                f"layer {self.layer_idx}: the model gave no conv_kernel_size; the cache cannot size the window"
            )
        if not self.is_initialized:
            self.lazy_initialization(conv_states=conv_states, conv_kernel_size=conv_kernel_size)
        step = current_step()
        width = conv_states.shape[-1]
        if width != step.q_len:
            raise ValueError(f"step announced {step.q_len} new tokens, the layer wrote {width}")
        view = step.on(self.device)
        slots = view.query_slots  # [B, W]
        channels, ring = self.inputs.shape[1], self.inputs.shape[2]
        back = conv_kernel_size - 1
        if back > ring - self.RING:
            raise ValueError(
                f"layer {self.layer_idx}: conv kernel {conv_kernel_size} is wider than its first step's"
            )
        before = slots[:, :1] + torch.arange(-back, 0, device=self.device)  # [B, back]
        previous = self.inputs.gather(2, before.remainder(ring)[:, None, :].expand(-1, channels, -1))
        kept = min(width, ring)
        written = slots[:, width - kept :].remainder(ring)[:, None, :].expand(-1, channels, -1)
        self.inputs.scatter_(2, written, conv_states[..., width - kept :].to(self.dtype))
        window = torch.cat([before, slots], dim=1)  # [B, back + W]
        valid = (window >= view.pad[:, None]) & (window >= 0)
        return torch.cat([previous, conv_states.to(self.dtype)], dim=2) * valid[:, None, :].to(self.dtype)

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs
    ) -> torch.Tensor:
        """Keep ``recurrent_states`` ``[B, ...]`` as each row's state after the current step's last slot."""
        if state_idx != 0:
            raise NotImplementedError(f"layer {self.layer_idx}: one recurrent state per layer is supported")
        self._keep(recurrent_states[:, None])
        return recurrent_states

    def ring_start(self) -> torch.Tensor:
        """Each row's ring slot of the current step's first token (``[B]``, on the ring's device), for a kernel that
        reads the state before the step from the ring and writes the state after each token into it
        (`hf_sparse_verify.kernels.gated_delta.gated_delta_ring`); slots are taken modulo `RING`."""
        self.lent = None
        return current_step().on(self.ring.device).start

    def _keep(self, states: torch.Tensor) -> None:
        """Write ``states`` ``[B, n, ...]`` as each row's states after the current step's last ``n`` slots."""
        self.lent = None
        step = current_step()
        if self.ring is None:
            shape = (states.shape[0], self.RING, *states.shape[2:])
            self.ring = torch.zeros(shape, dtype=states.dtype, device=states.device)
        view = step.on(self.ring.device)
        count = states.shape[1]
        rows = torch.arange(self.ring.shape[0], device=self.ring.device)[:, None]
        first = view.start[:, None] + step.q_len - count
        slots = (first + torch.arange(count, device=self.ring.device)).remainder(self.RING)
        self.ring[rows, slots] = states.to(self.ring.dtype)

    def settle(self) -> None:
        """After a call of the layer's mixer: keep the state it was given as the state after the call's last slot
        where the mixer advanced it in place instead of handing it back (Mamba's one-token recurrent form)."""
        if self.lent is not None:
            self.update_recurrent_state(self.lent)

    def ring_entries(self, first: int, count: int) -> list[tuple]:
        """What a write to slots ``[first, first + count)`` would overwrite in this layer's rings: ``(buffer, dim,
        positions, saved values)`` per ring, for `SpecCache.keep_rings`."""
        entries = []
        for buffer, dim in ((self.inputs, 2), (self.ring, 1)):
            if buffer is not None:
                positions = (first + torch.arange(count, device=buffer.device)).remainder(buffer.shape[dim])
                entries.append((buffer, dim, positions, buffer.index_select(dim, positions)))
        return entries

    @property
    def nbytes(self) -> int:
        """Bytes of its buffers allocated so far: convolution inputs and the ring of states."""
        return sum(t.nbytes for t in (self.inputs, self.ring) if t is not None)

    def reset(self) -> None:
        if self.is_initialized:
            self.inputs.zero_()
        if self.ring is not None:
            self.ring.zero_()


class SpecHybridLayer(SpecConvLayer):
    """A layer with a recurrent mixer beside its attention (Falcon-H1's layers, Zamba's hybrid layers: transformers'
    ``hybrid`` cache layers): the mixer's convolution inputs and states as a `SpecConvLayer`, the attention's keys
    and values in a `SpecLayer` of its own (``kv``), each allocated on its first write."""

    def __init__(self, owner: SpecCache, layer_idx: int):
        super().__init__(owner, layer_idx)
        self.kv = SpecLayer(owner, layer_idx)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return self.kv.update(key_states, value_states, *args, **kwargs)

    def direct_write_slots(self, batch: int, q_len: int, dtype: torch.dtype) -> torch.Tensor | None:
        return self.kv.direct_write_slots(batch, q_len, dtype)

    @property
    def keys(self) -> torch.Tensor | None:
        return self.kv.keys if self.kv.is_initialized else None

    @property
    def values(self) -> torch.Tensor | None:
        return self.kv.values if self.kv.is_initialized else None

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.kv.get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.kv.get_seq_length()

    def get_max_length(self) -> int:
        return self.owner.capacity

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.kv.nbytes

    def reset(self) -> None:
        super().reset()
        self.kv.reset()


class SpecCache(Cache):
    """Preallocated cache of ``capacity`` slots per row for ``num_layers`` layers.

    Example:
        >>> cache = SpecCache(num_layers=2, batch_size=1, capacity=8)
        >>> cache.capacity
        8
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        capacity: int,
        recurrent_layers=(),
        shared_layers=None,
        hybrid_layers=(),
    ):
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.batch_size_ = batch_size
        self.capacity = capacity
        conv, hybrid = set(recurrent_layers), set(hybrid_layers)
        layers = [
            SpecHybridLayer(self, i)
            if i in hybrid
            else SpecConvLayer(self, i)
            if i in conv
            else SpecLayer(self, i)
            for i in range(num_layers)
        ]
        # a KV-shared layer (Gemma 3n / 4) is its source layer: it writes nothing, and what reads its cache by
        # index (self-speculation's selections) finds the keys it attends to
        for shared, source in (shared_layers or {}).items():
            layers[shared] = layers[source]
        super().__init__(layers=layers)

    @property
    def batch_size(self) -> int:
        return self.batch_size_

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens before the current step (every layer holds the same slots; also for models with no attention
        layer, whose `Cache.get_seq_length` would refuse)."""
        step = current_step(required=False)
        return 0 if step is None else step.kv_len - step.q_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        step = current_step(required=False)
        return (step.kv_len if step is not None else self.capacity), 0

    def check_fits(self, kv_len: int) -> None:
        if kv_len > self.capacity:
            raise ValueError(
                f"step reads {kv_len} cache slots but the cache holds {self.capacity}: "
                "size the cache from prompt + max_new_tokens + max_draft_tokens"
            )

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers allocated so far (layers allocate on their first write): keys and values,
        recurrent layers' inputs and states, DSA indexers' keys; a shared layer's entry counted once."""
        return sum(layer.nbytes for layer in {id(layer): layer for layer in self.layers}.values())

    @contextlib.contextmanager
    def keep_rings(self, first: int, count: int) -> Iterator[None]:
        """Within the block, writes to slots ``[first, first + count)`` leave the recurrent layers' rings (their
        convolution inputs and states, `SpecConvLayer`) as they were on entry; a ring allocated inside the block is
        zeroed on exit. A graph capture's warm-up runs write the last cache slots, which are dead in a buffer with one
        entry per slot, but a ring holds slot ``s`` at ``s mod`` its length, where they alias live entries."""
        rings = [
            layer
            for layer in {id(layer): layer for layer in self.layers}.values()
            if isinstance(layer, SpecConvLayer)
        ]
        before = [(layer.inputs, layer.ring) for layer in rings]
        saved = [entry for layer in rings for entry in layer.ring_entries(first, count)]
        try:
            yield
        finally:
            for buffer, dim, positions, values in saved:
                buffer.index_copy_(dim, positions, values)
            for layer, (inputs, ring) in zip(rings, before):
                for old, new in ((inputs, layer.inputs), (ring, layer.ring)):
                    if old is None and new is not None:
                        new.zero_()

    def layer_device(self, layer_idx: int) -> torch.device | None:
        layer = self.layers[layer_idx]
        return layer.device if layer.is_initialized else None

    def layer_devices(self, default: torch.device) -> list[torch.device]:
        """The device of every layer's buffers (``default`` for layers not yet written)."""
        return [self.layer_device(i) or default for i in range(len(self.layers))]
