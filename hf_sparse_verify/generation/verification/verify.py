"""Verification: which draft tokens the target accepts, and the one token it adds.

Definitions, per row of the batch, for a step that verifies ``K`` drafts ``d_0 .. d_{K-1}`` (the row proposed
``n <= K`` of them; positions ``>= n`` are padding and never accepted) with the target's processed scores at
``K + 1`` positions (position ``i`` scores the token that follows the history plus ``d_0 .. d_{i-1}``):

- *accepted*: the longest prefix ``d_0 .. d_{m-1}`` that verification keeps, ``0 <= m <= n``;
- *rejected*: ``d_m`` (when ``m < n``) and everything after it;
- *bonus*: the token emitted at position ``m``: the correction of the first rejected draft, or, when all ``n``
  drafts were accepted, one more token from the target's distribution at position ``n``.

Every step therefore emits ``m + 1`` tokens: ``d_0 .. d_{m-1}`` and the bonus. These functions are pure: no host
synchronisation, no state; ``K = 0`` is a plain decode step.
"""

from __future__ import annotations

import torch


def _write_bonus(drafts: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    # tokens[:, :m] = drafts[:, :m], tokens[:, m] = bonus; positions after m keep draft values (ignored)
    batch, k = drafts.shape
    tokens = torch.cat([drafts, drafts.new_zeros(batch, 1)], dim=1)  # [B, K+1]
    tokens.scatter_(1, accepted[:, None], bonus[:, None])
    return tokens


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row of a ``[B, K]`` bool tensor."""
    return mask.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _draft_valid(drafts: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(drafts.shape[1], device=drafts.device)
    return positions[None, :] < num_drafts[:, None]  # [B, K]


def verify_greedy(
    drafts: torch.Tensor, num_drafts: torch.Tensor, scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept drafts while they equal the target's argmax.

    Args:
        drafts: ``[B, K]`` int64 draft tokens.
        num_drafts: ``[B]`` int64, drafts proposed per row (``<= K``).
        scores: ``[B, K + 1, V]`` target scores after logits processors.

    Returns:
        ``accepted`` ``[B]`` int64 and ``tokens`` ``[B, K + 1]``: ``tokens[b, :accepted[b] + 1]`` are the tokens
        row ``b`` emits (accepted drafts, then the bonus).

    Example:
        >>> scores = torch.zeros(1, 3, 5); scores[0, 0, 2] = 1; scores[0, 1, 4] = 1; scores[0, 2, 1] = 1
        >>> accepted, tokens = verify_greedy(torch.tensor([[2, 3]]), torch.tensor([2]), scores)
        >>> accepted.tolist(), tokens[0, : accepted[0] + 1].tolist()
        ([1], [2, 4])
    """
    assert scores.shape[:2] == (drafts.shape[0], drafts.shape[1] + 1), (scores.shape, drafts.shape)
    target = scores.argmax(dim=-1)  # [B, K+1]
    match = (drafts == target[:, :-1]) & _draft_valid(drafts, num_drafts)
    accepted = _leading_true(match)
    bonus = target.gather(1, accepted[:, None]).squeeze(1)
    return accepted, _write_bonus(drafts, accepted, bonus)


def verify_sampling_without_probs(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    scores: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling verification for drafters that give no probabilities (n-gram lookup).

    Draws one sample from the target's distribution at every position and accepts drafts while the sample equals
    the draft; the bonus is the sample at the first mismatch (or after the last draft). Each emitted token is then
    a sample from the target given the emitted prefix, so the output distribution is the target's.

    Args and returns as :func:`verify_greedy`; ``scores`` are processed logits (temperature, top-k, ... applied).
    """
    batch, k1, vocab = scores.shape
    assert k1 == drafts.shape[1] + 1 and batch == drafts.shape[0], (scores.shape, drafts.shape)
    probs = torch.softmax(scores, dim=-1)
    samples = torch.multinomial(probs.reshape(-1, vocab), 1, generator=generator).view(batch, k1)
    match = (drafts == samples[:, :-1]) & _draft_valid(drafts, num_drafts)
    accepted = _leading_true(match)
    bonus = samples.gather(1, accepted[:, None]).squeeze(1)
    return accepted, _write_bonus(drafts, accepted, bonus)


def verify_speculative_sampling(
    drafts: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    scores: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al., 2023; Chen et al., 2023).

    Draft ``d_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection the bonus
    is drawn from ``norm(max(p_i - q_i, 0))``; when all drafts are accepted it is drawn from ``p`` at the next
    position. The emitted tokens are distributed exactly as samples from ``p``.

    Args:
        drafts: ``[B, K]`` draft tokens, sampled from ``draft_probs``.
        num_drafts: ``[B]`` drafts proposed per row.
        draft_probs: ``[B, K, V]`` the drafter's sampling distributions ``q``.
        scores: ``[B, K + 1, V]`` target scores after logits processors (``p = softmax(scores)``).

    Returns:
        as :func:`verify_greedy`.
    """
    batch, k = drafts.shape
    vocab = scores.shape[-1]
    assert draft_probs.shape == (batch, k, vocab), (draft_probs.shape, drafts.shape, scores.shape)
    p = torch.softmax(scores.float(), dim=-1)  # [B, K+1, V]
    q = draft_probs.float()
    p_draft = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # [B, K]
    q_draft = q.gather(-1, drafts[..., None]).squeeze(-1)
    uniform = torch.rand(batch, k, device=scores.device, generator=generator)
    keep = (uniform * q_draft < p_draft) & _draft_valid(drafts, num_drafts)
    accepted = _leading_true(keep)  # [B]

    index = accepted[:, None, None].expand(batch, 1, vocab)
    p_at = p.gather(1, index).squeeze(1)  # [B, V]
    q_full = torch.cat([q, q.new_zeros(batch, 1, vocab)], dim=1)
    q_at = q_full.gather(1, index).squeeze(1)
    q_at = torch.where((accepted < num_drafts)[:, None], q_at, torch.zeros_like(q_at))
    residual = (p_at - q_at).clamp_min(0)
    total = residual.sum(-1, keepdim=True)
    residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p_at)
    bonus = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return accepted, _write_bonus(drafts, accepted, bonus)
