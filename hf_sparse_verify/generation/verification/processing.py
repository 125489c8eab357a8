"""Logits processors and stopping criteria applied to a verify window exactly as plain generation would.

Plain `generate` calls ``processor(input_ids, scores)`` once per token with the history up to that token. A
verify step scores ``K + 1`` positions per row at once, and rows of a batch hold histories of different lengths.
Processors that never look at the history (temperature, top-k, top-p, ...) are applied once to all positions;
any other processor is called once per position and history length, with the whole batch (processors may hold
per-row state) and the exact history of the rows that have that length. Stopping criteria are treated the same way: max length and EOS natively,
anything else per emitted token with the exact history.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

#: processors whose output depends only on the scores of one position, never on the token history
HISTORY_FREE_PROCESSORS: tuple[type, ...] = tuple(
    getattr(lp, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "TopHLogitsWarper",
        "LogitNormalization",
        "InfNanRemoveLogitsProcessor",
        "SuppressTokensLogitsProcessor",
    )
    if hasattr(lp, name)
)


def is_history_free(processors) -> bool:
    return all(isinstance(p, HISTORY_FREE_PROCESSORS) for p in processors)


def history_free_part(processors) -> lp.LogitsProcessorList:
    """The history-free processors of a list (used to shape a drafter's own sampling distribution)."""
    return lp.LogitsProcessorList([p for p in processors if isinstance(p, HISTORY_FREE_PROCESSORS)])


def process_window(
    processors,
    tokens: torch.Tensor,
    committed: list[int],
    active: list[bool],
    drafts: torch.Tensor,
    logits: torch.Tensor,
) -> torch.Tensor:
    """Apply ``processors`` to every verified position.

    Args:
        processors: a `LogitsProcessorList` (may be empty).
        tokens: ``[B, capacity]`` token buffer on the device of ``logits``; row ``b`` holds its history in
            ``[:committed[b]]``.
        committed: host list, history length per row (left padding included, as plain generate sees it).
        active: host list, rows still generating (others are left unprocessed).
        drafts: ``[B, K]`` draft tokens of this step.
        logits: ``[B, K + 1, V]`` float32 target logits.

    Returns:
        ``[B, K + 1, V]`` scores.
    """
    if len(processors) == 0:
        return logits
    batch, k1, vocab = logits.shape
    if is_history_free(processors):
        flat = logits.reshape(batch * k1, vocab)
        dummy = tokens[:, :1].repeat_interleave(k1, dim=0)
        return processors(dummy, flat).view(batch, k1, vocab)

    # Processors may keep per-row state (e.g. a per-row prompt length), so every call sees the whole batch; one
    # call per (history length, position) serves the rows whose history has that length, the other rows' outputs
    # are discarded.
    scores = logits.clone()
    groups: dict[int, list[int]] = defaultdict(list)
    for row in range(batch):
        if active[row]:
            groups[committed[row]].append(row)
    for length, rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        for i in range(k1):
            input_ids = torch.cat([tokens[:, :length], drafts[:, :i]], dim=1)
            scores[index, i] = processors(input_ids, logits[:, i].clone())[index]
    return scores


class StopChecker:
    """Decides, per row, how many of a step's new tokens to keep and whether the row is finished.

    ``MaxLengthCriteria`` and ``EosTokenCriteria`` are handled from host-side numbers; every other criterion is
    called per new token with the row's exact history (one row at a time), in order, as plain generation would.
    """

    def __init__(self, stopping_criteria, max_length: int, eos_token_ids: list[int]):
        self.max_length = max_length
        self.eos = set(eos_token_ids)
        self.generic = []
        for criterion in stopping_criteria:
            if isinstance(criterion, sc.MaxLengthCriteria):
                self.max_length = min(self.max_length, criterion.max_length)
            elif isinstance(criterion, sc.EosTokenCriteria):
                self.eos.update(int(t) for t in criterion.eos_token_id.flatten().tolist())
            else:
                self.generic.append(criterion)

    def keep(self, tokens: torch.Tensor, row: int, committed: int, new_tokens: list[int]) -> tuple[int, bool]:
        """How many of ``new_tokens`` row ``row`` keeps, and whether it finished.

        ``tokens`` must already hold ``new_tokens`` at ``[committed, committed + len(new_tokens))``.
        """
        budget = self.max_length - committed
        count = min(len(new_tokens), budget)
        finished = count == budget
        for j in range(count):
            if new_tokens[j] in self.eos:
                count, finished = j + 1, True
                break
        if self.generic and count > 0:
            # every criterion on every prefix, then one readback
            hits = torch.stack(
                [
                    torch.as_tensor(
                        c(tokens[row : row + 1, : committed + j + 1], None), device=tokens.device
                    ).reshape(-1)[0]
                    for j in range(count)
                    for c in self.generic
                ]
            ).view(count, len(self.generic))
            stops = hits.any(dim=1).nonzero().flatten().tolist()
            if stops:
                return stops[0] + 1, True
        return count, finished
