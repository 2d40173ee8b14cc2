"""What GPU this machine has, as NVML says: the compute capability that picks each engine's
variant, and the driver and CUDA versions for the manifest. No NVML or no GPU = CPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["GpuHost", "detect_gpu", "gpu_memory_used_mib"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuHost:
    compute_capability: tuple[int, int] | None
    name: str | None = None
    driver: str | None = None
    cuda: str | None = None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpu() -> GpuHost:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver: a CPU machine
        log.info("no NVIDIA GPU found (%s): engines get their CPU variant", type(exc).__name__)
        return GpuHost(compute_capability=None)
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return GpuHost(compute_capability=None)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        return GpuHost(
            compute_capability=(int(major), int(minor)),
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda=f"{cuda // 1000}.{cuda % 1000 // 10}",
        )
    finally:
        pynvml.nvmlShutdown()


def gpu_memory_used_mib() -> float | None:
    """Memory in use on every GPU together, or None without NVML (then nothing is checked)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML: the check does not apply
        return None
    try:
        count = pynvml.nvmlDeviceGetCount()
        return sum(
            pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used / 2**20
            for i in range(count)
        )
    finally:
        pynvml.nvmlShutdown()
