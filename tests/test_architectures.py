"""Every causal LM in transformers' registry (tiny random float32 model, left-padded batch of 2, prompt_lookup and
vegas): token-identical to plain greedy ``generate``, or refused with a specific reason before generating.

No architecture may give different tokens or an unexplained exception. Architectures whose tiny model cannot be
built offline (or whose plain ``generate`` fails) are skipped with the reason; ``scripts/supported_models.py`` runs
the same survey and writes the README's table. The whole file takes about a minute on one CPU thread.
"""

from __future__ import annotations

import re

import pytest
from arch_survey import causal_lm_types, survey

#: a refusal names the (text) model type, the class, and what is missing
REFUSAL = re.compile(r"^model type '[\w-]+' \(\w+\) is not supported: .{20,}")


@pytest.mark.parametrize("model_type", causal_lm_types())
def test_identical_or_refused(model_type):
    outcome = survey(model_type)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    assert outcome.status in ("identical", "refused"), f"{model_type}: {outcome.status}: {outcome.reason}"
    if outcome.status == "refused":
        assert REFUSAL.match(outcome.reason), outcome.reason
