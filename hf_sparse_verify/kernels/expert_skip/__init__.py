"""Expert skipping's per-token bookkeeping in one launch (LOSSY sparse verification, the sparse-verification paper §3.5): each token's
routed experts in weight order and how many it keeps (`expert_skip`), where the eager path runs a sort, a gather and
a dozen small kernels for the shares per MoE layer (`hf_sparse_verify.kernels.expert_skip.naive.order_by_weight` and
`skip_counts`, the reference)."""

from .naive import expert_skip_naive
from .op import RULES, expert_skip

__all__ = ["RULES", "expert_skip", "expert_skip_naive"]
