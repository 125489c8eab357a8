"""`benchmarks/bench_multigpu.py` off multi-GPU machines: it refuses with the reason, and its prompts repeat their
first half (text prompt lookup can copy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import bench_multigpu  # noqa: E402


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has several GPUs")
def test_refuses_below_two_gpus(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_multigpu.py", "--no-save"])
    with pytest.raises(SystemExit, match="needs two or more GPUs"):
        bench_multigpu.main()


def test_prompt_repeats_its_first_half():
    ids = bench_multigpu.prompt(vocab=1000, batch=2, context=9, device="cpu")
    assert ids.shape == (2, 9)
    assert torch.equal(ids[:, 5:], ids[:, :4])
