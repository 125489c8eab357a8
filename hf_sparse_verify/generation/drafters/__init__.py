"""Drafters: one module per strategy, all implementing `Drafter`."""

from .base import Draft, Drafter, VerifyFeedback

__all__ = ["Draft", "Drafter", "VerifyFeedback"]
