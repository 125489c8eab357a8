"""The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5) over a verify window in one launch, with the state
after every token (used by `hf_sparse_verify.integrations.recurrent.GatedDeltaWindow` on the GPU)."""

from .naive import gated_delta_window_naive
from .op import gated_delta_window

__all__ = ["gated_delta_window", "gated_delta_window_naive"]
