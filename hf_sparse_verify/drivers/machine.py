"""Machine facts for benchmark JSON (GPU, versions, commit) and the measured device copy bandwidth."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def commit() -> str:
    """``GIT_COMMIT`` when set (copies of the tree, like the device machine's, may carry a stale ``.git``), else
    the git commit of the source tree."""
    if os.environ.get("GIT_COMMIT"):
        return os.environ["GIT_COMMIT"]
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
        )
        if proc.returncode == 0 and len(proc.stdout.strip()) == 40:
            return proc.stdout.strip()
    except OSError:
        pass
    return "unknown (set GIT_COMMIT where the tree has no .git)"


def machine_info(device: torch.device) -> dict:
    import transformers

    from .._version import __version__

    info = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_sparse_verify": __version__,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def copy_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), median of ``repeats`` copies of
    a ``megabytes`` buffer."""
    n = megabytes * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    times = time_calls(lambda: dst.copy_(src), device, warmups=3, repeats=repeats)
    return 2 * src.numel() * 4 / median(times)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def time_calls(fn, device: torch.device, warmups: int, repeats: int, after=None) -> list[float]:
    """Seconds per call of ``fn``: host clock around a synchronized call (the whole step as a user sees it,
    launch overhead included); ``after`` runs untimed after each call."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmups):
        fn()
        if after is not None:
            after()
    times = []
    for _ in range(repeats):
        sync()
        begin = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - begin)
        if after is not None:
            after()
    return times
