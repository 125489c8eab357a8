"""CUDA-graph capture that fails leaves the GPU usable: the loop's eager fallback may sample. Skipped without a CUDA
GPU."""

from __future__ import annotations

import pytest
import torch

from hf_sparse_verify.generation.engine.graphs import capture_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_random_ops_work_after_a_failed_capture():
    """A captured function that reads a value on the host (illegal in a capture) fails the capture; random numbers
    on that GPU and a later capture still work."""
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(4, device=device)

    def syncs():
        return x * float(x.sum().item())

    with pytest.raises(RuntimeError):
        capture_graph(syncs, device)
    torch.cuda.synchronize(device)
    draws = torch.randint(0, 10, (8,), device=device)
    assert draws.shape == (8,)
    graph, out = capture_graph(lambda: x * 2, device)
    x.fill_(3.0)
    graph.replay()
    torch.testing.assert_close(out, torch.full((4,), 6.0, device=device))
