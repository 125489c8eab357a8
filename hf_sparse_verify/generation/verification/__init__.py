"""Verification: accept/reject rules (greedy, speculative sampling) and the logits processors and stopping
criteria applied to a verify window exactly as plain generation would."""
