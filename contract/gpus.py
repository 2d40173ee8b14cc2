"""EC2 GPU instance families: which NVIDIA GPU each carries and its compute capability.

Shared by the stack (which instance types it accepts), the spec check (which engine
variant an arm gets on a shard) and reports (the GPU named in the scope line). Sources:
the EC2 accelerated-computing instance pages and NVIDIA's compute-capability table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CPU_ARCHITECTURES", "GPU_FAMILIES", "GpuFamily", "gpu_family"]

# The CPU architectures GPU instances come in; the stack keeps launch templates for each.
CPU_ARCHITECTURES = ("x86_64", "arm64")


@dataclass(frozen=True, slots=True)
class GpuFamily:
    gpu: str
    compute_capability: tuple[int, int]
    cpu_arch: str  # what the AMI must be built for: x86_64 or arm64

    @property
    def sm(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


GPU_FAMILIES: Mapping[str, GpuFamily] = {
    "g4dn": GpuFamily("NVIDIA T4", (7, 5), "x86_64"),
    "g5": GpuFamily("NVIDIA A10G", (8, 6), "x86_64"),
    "g6": GpuFamily("NVIDIA L4", (8, 9), "x86_64"),
    "gr6": GpuFamily("NVIDIA L4", (8, 9), "x86_64"),
    "g6e": GpuFamily("NVIDIA L40S", (8, 9), "x86_64"),
    "g7": GpuFamily("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), "x86_64"),
    "p4d": GpuFamily("NVIDIA A100 40GB", (8, 0), "x86_64"),
    "p4de": GpuFamily("NVIDIA A100 80GB", (8, 0), "x86_64"),
    "p5": GpuFamily("NVIDIA H100", (9, 0), "x86_64"),
    "p5e": GpuFamily("NVIDIA H200", (9, 0), "x86_64"),
    "p5en": GpuFamily("NVIDIA H200", (9, 0), "x86_64"),
    "p6-b200": GpuFamily("NVIDIA B200", (10, 0), "x86_64"),
    "p6-b300": GpuFamily("NVIDIA B300", (10, 3), "x86_64"),
    "g5g": GpuFamily("NVIDIA T4G", (7, 5), "arm64"),
    "p6e-gb200": GpuFamily("NVIDIA GB200", (10, 0), "arm64"),
}


def gpu_family(instance_type: str) -> GpuFamily | None:
    """'g6.4xlarge' -> the L4 entry; None for a type that is not a known GPU family."""
    return GPU_FAMILIES.get(instance_type.split(".", 1)[0])
