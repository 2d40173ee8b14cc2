"""Whether the engine's batch-1 Triton kernels (`kernels`, `attention_kernel`) launch as
programmatic dependents of the kernel before them (PDL, CUDA compute capability 9.0 and
later): one process-wide switch, set by the runner from the engine's configuration.

Why: a batch-1 decode step is hundreds of kernels of a few microseconds each (the counts
and times measured on an H200 are in
benchmarks/records/2026-11-30-h200-pytorch-dependent-launch.md); each pays a launch and
the first round trip to memory before its bytes stream, while the kernel before it drains.
Launched as a dependent, a kernel's programs start while the previous kernel's last
programs run; each waits (`griddepcontrol.wait`) before it reads or writes anything an
earlier kernel touches, so only work that depends on no earlier kernel (a projection's
first chunk of weights) moves ahead. A CUDA graph captures the dependency as a
programmatic edge, so the replayed step overlaps the same way.
"""

from __future__ import annotations

import functools

import torch

_requested = True


def configure(enabled: bool) -> None:
    """Ask for dependent launches (where the device has them) or turn them off."""
    global _requested
    _requested = enabled


def enabled(device: torch.device) -> bool:
    """Launch this device's kernels as programmatic dependents?"""
    return _requested and device.type == "cuda" and _capable(device.index)


@functools.cache
def _capable(index: int | None) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9
