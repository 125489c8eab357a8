"""Block summaries: per-block mean keys (built at prefill, updated incrementally), block scoring against one
query row, and top-n block selection for block-sparse verification."""

from .op import build_block_summaries, score_blocks, select_top_blocks, update_block_summaries

__all__ = ["build_block_summaries", "score_blocks", "select_top_blocks", "update_block_summaries"]
