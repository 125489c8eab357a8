"""Step timers that add no synchronisation: CUDA events on GPU (read after the step's own readback, by which time
they have completed), host clocks on CPU."""

from __future__ import annotations

import time

import torch


class StepTimer:
    """Marks named points of a step and reports the seconds between them once the step has been read back."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def seconds(self, first: str, last: str) -> float:
        """Seconds from mark ``first`` to mark ``last``; call only after a readback that followed ``last``."""
        a, b = self.marks[first], self.marks[last]
        if self.cuda:
            b.synchronize()  # recorded after the step's readback: nothing queued before it, returns at once
            return a.elapsed_time(b) / 1000.0
        return b - a
