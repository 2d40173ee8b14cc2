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

What a dependent may read before its wait: what no kernel of the running chain writes.
That is weights, rows of the KV pools an earlier step or prefill wrote, and what an
ordinary kernel made earlier on the stream: a dependent starts only once the kernel
before it has started, and the first dependent after an ordinary kernel only once that
kernel has ended. The step's inputs (positions, the rotary rows at them, the attention
masks) are made so, by torch's own kernels before the layers, and the batch-1 attention
kernel reads them and its block of keys before its wait (`attention_kernel`).
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
