"""The decoding-time experts switch (transformers' defaults grouped_mm / eager -> batched_mm off CPU where our fused
experts cannot run; a batched_mm chosen by the user is kept)."""

from __future__ import annotations

import pytest
import torch
from conftest import decoding_experts


class _StubMoE(torch.nn.Module):
    def __init__(self, device: str, impl: dict):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(2, device=device))
        self.impl = dict(impl)
        self.calls = []

    def get_experts_implementation(self):
        return dict(self.impl)

    def set_experts_implementation(self, impl):
        self.calls.append(dict(impl))
        self.impl = dict(impl)


def test_switches_defaults_off_cpu_and_restores():
    model = _StubMoE("meta", {"": "grouped_mm", "vision": "eager", "audio": "batched_mm"})
    with decoding_experts(model):
        assert model.impl == {"": "batched_mm", "vision": "batched_mm", "audio": "batched_mm"}
    assert model.impl == {"": "grouped_mm", "vision": "eager", "audio": "batched_mm"}


def test_restores_after_an_error():
    model = _StubMoE("meta", {"": "grouped_mm"})
    with pytest.raises(RuntimeError), decoding_experts(model):
        raise RuntimeError("boom")
    assert model.impl == {"": "grouped_mm"}


@pytest.mark.parametrize(
    "device, impl",
    [("cpu", {"": "grouped_mm"}), ("cpu", {"": "eager"}), ("meta", {"": "batched_mm"}), ("meta", {})],
)
def test_leaves_other_cases_alone(device, impl):
    model = _StubMoE(device, impl)
    with decoding_experts(model, torch.nn.Linear(2, 2)):  # a dense module has no experts API
        pass
    assert model.calls == []
