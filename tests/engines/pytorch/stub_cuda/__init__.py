"""Triton's own CUDA launch path on a host with no GPU: a test file's child process whose
CUDA driver is `libcuda.c`, a stand-in libcuda.so.1 built here that answers as one H200.

What it checks that a build for sm_90 alone does not: the launch as the engine makes it,
through Triton's JIT binder (each argument's specialization, tuple constexprs, the options
a launch passes), the generated launcher's build and argument packing, and the driver's
own checks of the launch (threads against the registers a thread, dynamic shared memory).
Each launch is logged (`Launch`), never run: the arithmetic is the interpreter's tests'.

In the child, `as_h200()` makes Triton's driver the stub's device before any launch;
tensors stay in host memory (the stub reads no pointer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.engines.pytorch import interpreter_child

SOURCE = Path(__file__).with_name("libcuda.c")


@dataclass(frozen=True)
class Launch:
    """One launch the stub driver accepted (`libcuda.c` writes these fields)."""

    kernel: str
    grid: tuple[int, int, int]
    threads: int
    shared_bytes: int
    regs: int
    local_bytes: int
    dependent: bool  # launched as a programmatic dependent of the launch before


def compiler() -> str | None:
    """The C compiler Triton builds its launchers with (`CC`, else cc), if there is one."""
    return shutil.which(os.environ.get("CC", "cc"))


def run(
    script: str, part: str, directory: Path, timeout_s: int = 900
) -> tuple[Any, list[Launch]]:
    """`script`'s child `part` with the stub as its libcuda.so.1 (built into `directory`,
    with the child's Triton cache): its result and the launches it made."""
    cc = compiler()
    assert cc is not None, "no C compiler: Triton cannot build a launcher either"
    include = _triton_dir() / "backends" / "nvidia" / "include"
    library = directory / "libcuda.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f"-I{include}", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    log = directory / "launches.jsonl"
    libraries = (str(directory), os.environ.get("LD_LIBRARY_PATH", ""))
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, libraries)),
        "TRITON_LIBCUDA_PATH": str(directory),
        "TRITON_CACHE_DIR": str(directory / "triton"),
        "STUB_CUDA_LOG": str(log),
    }
    result = interpreter_child.child(script, part, env=env, timeout_s=timeout_s)
    lines = log.read_text().splitlines() if log.exists() else []
    launches = [_launch(json.loads(line)) for line in lines]
    return result, launches


def _launch(fields: dict[str, Any]) -> Launch:
    return Launch(**{**fields, "grid": tuple(fields["grid"])})


def _triton_dir() -> Path:
    import triton

    return Path(triton.__file__).parent


def builds_ptx(kernel: Any) -> list[str]:
    """In the child: the PTX of each build of `kernel` (a `triton.jit` function) on the
    stub's device, in the order compiled; its cache is then emptied, so the next launches
    compile their own."""
    builds = [compiled.asm["ptx"] for compiled in kernel.device_caches[0][0].values()]
    kernel.device_caches.clear()
    return builds


def as_h200() -> None:
    """In the child: Triton's active driver is its own CUDA driver over the stub, with the
    device, stream and capability torch.cuda would report for one H200."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver

    class StubH200(CudaDriver):
        def __init__(self) -> None:
            super().__init__()
            # GPUDriver binds these to torch.cuda, which a CPU build of torch lacks.
            self.get_current_device = lambda: 0
            self.set_current_device = lambda device: None
            self.get_current_stream = lambda device=None: 0
            self.get_device_capability = lambda device=0: (9, 0)

        def get_current_target(self) -> GPUTarget:
            return GPUTarget("cuda", 90, 32)

    driver.set_active(StubH200())
