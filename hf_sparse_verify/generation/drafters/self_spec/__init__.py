"""Self-speculative drafters (Vegas, StreamingLLM, Quest) and their KV selection."""

from .drafter import QuestDrafter, SelfSpecDrafter, StreamingDrafter, VegasDrafter

__all__ = ["QuestDrafter", "SelfSpecDrafter", "StreamingDrafter", "VegasDrafter"]
