"""`calibrate`: runs calibration prompts through the engine's own runner (prefill, then one dense verify forward of
the last ``verify_tokens`` tokens per prompt, recording what lossy sparse verification would have selected) and
returns the model's `SparseCalibration` (attention similarities, FFN thresholds, MoE maps and damage). A driver: it
runs the model, so it sits above the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from tqdm.auto import tqdm

from ..generation.engine.runner import ModelRunner
from ..integrations import Mode, speculation_mode
from ..sparse.calibration import FFN_LEVELS, SparseCalibration
from ..sparse.config import LossySparseVerify, SparseAttention
from ..sparse.state import SparseVerifyState
from ..step import Phase
from .ffn_stats import FFNStats
from .moe_damage import calibrate_moe


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a & b| / |a | b|`` of two bool masks (1.0 when both are empty)."""
    union = (a | b).sum().item()
    return 1.0 if union == 0 else (a & b).sum().item() / union


@torch.no_grad()
def calibrate(
    model,
    prompts: list[torch.Tensor],
    cfg: LossySparseVerify,
    *,
    verify_tokens: int = 8,
    progress: bool = True,
) -> SparseCalibration:
    """Calibrate ``model`` on ``prompts`` (1-D token id tensors, each longer than ``verify_tokens``) for the parts
    ``cfg`` enables: attention similarities (with ``cfg.attention``'s block size, rho and L0), FFN thresholds
    (``cfg.ffn``), MoE maps and damage (``cfg.moe``; raises when the damage passes ``cfg.moe.max_damage``)."""
    text = model.config.get_text_config()
    layers = text.num_hidden_layers
    device = model.get_input_embeddings().weight.device
    calibration = SparseCalibration(model.config.model_type, layers, len(prompts), verify_tokens)
    attention = cfg.attention or SparseAttention()
    record_cfg = LossySparseVerify(attention=dataclasses.replace(attention, reuse=False))
    similarity = [0.0] * layers
    ffn_stats = None
    if cfg.ffn is not None:
        ffn_stats = FFNStats(
            model, group=verify_tokens
        )  # the max over a verify row's tokens, as at verify time
    with speculation_mode(model, mode=Mode()):
        for ids in tqdm(prompts, desc="calibrate", unit="prompt", disable=not progress):
            if ids.dim() != 1 or ids.numel() <= verify_tokens:
                raise ValueError(f"calibration prompts must be 1-D with more than {verify_tokens} tokens")
            ids = ids.to(device)[None]
            runner = ModelRunner(model, 1, ids.shape[1], device, "reference")
            runner.set_padding([0])
            cut = ids.shape[1] - verify_tokens
            runner.prefill(ids[:, :cut])
            state = SparseVerifyState(
                record_cfg, layers, None, runner.cache.layer_devices(device), record=True
            )
            state.prefill(runner.cache, runner.pad_t, torch.full((1,), cut, device=device))
            start = torch.full((1,), cut, dtype=torch.long, device=device)
            with ffn_stats if ffn_stats is not None else contextlib.nullcontext():
                runner.forward(ids[:, cut:], start, Phase.VERIFY, kv_len=ids.shape[1], verify_sparsity=state)
            masks = state.attention.recorded
            for layer in range(1, layers):
                if layer in masks and layer - 1 in masks:
                    similarity[layer] += jaccard(masks[layer], masks[layer - 1]) / len(prompts)
    calibration.attention = {
        "block_size": attention.block_size,
        "rho": attention.rho,
        "dense_below": attention.dense_below,
        "similarity": similarity,
    }
    if ffn_stats is not None:
        calibration.ffn = {
            "levels": list(FFN_LEVELS),
            "thresholds": [
                [ffn_stats.threshold(layer, level) for level in FFN_LEVELS]
                if layer in ffn_stats.mlps
                else None
                for layer in range(layers)
            ],
        }
    if cfg.moe is not None:
        batches = [ids.to(device)[None] for ids in prompts]
        calibration.moe = calibrate_moe(
            model, batches, cfg.moe, progress=progress, window=verify_tokens
        ).summary
    return calibration
