"""The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5) over a verify window in one launch, the state read
from and the state after every token written to the cache's ring (used by
`hf_sparse_verify.integrations.recurrent.GatedDeltaWindow` on the GPU)."""

from .naive import gated_delta_ring_naive, gated_delta_window_naive
from .op import gated_delta_ring, gated_delta_window

__all__ = ["gated_delta_ring", "gated_delta_ring_naive", "gated_delta_window", "gated_delta_window_naive"]
