"""Reference: the scores a DSA indexer (DeepSeek-V3.2, GLM-MoE-DSA) ranks cached tokens by, in plain PyTorch
(imports only torch), in transformers' order of operations (5.24.0):

    score[b, s, t] = sum_h weights[b, s, h] * relu(scale * q[b, s, h] . keys[b, t])

all in float32. The indexer keeps one key per token (``[B, L, D]``, shared by its ``H`` query heads).

Example:
    >>> q = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [B=1, S=1, H=2, D=2]
    >>> keys = torch.tensor([[[2.0, -1.0], [-1.0, 3.0]]])  # [B=1, L=2, D=2]
    >>> index_scores_naive(q, keys, torch.tensor([[[1.0, 0.5]]]), scale=1.0).tolist()
    [[[2.0, 1.5]]]
"""

from __future__ import annotations

import torch


def index_scores_naive(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float) -> torch.Tensor:
    """``q`` ``[B, S, H, D]``, ``keys`` ``[B, L, D]``, ``weights`` ``[B, S, H]`` -> float32 ``[B, S, L]``."""
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2).unsqueeze(1)) * scale  # [B, S, H, L]
    return torch.matmul(weights.float().unsqueeze(-2), torch.relu(scores)).squeeze(-2)
