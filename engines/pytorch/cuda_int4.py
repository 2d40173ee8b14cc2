"""The batch-1 int4 product on the tensor cores, written in CUDA C (`int4_mma.cu`, whose
header says how it computes): compiled at first use for the device's SM by NVRTC (the
library torch's CUDA wheels carry), loaded through the driver, and launched by
`cuLaunchKernelEx`, as a programmatic dependent of the kernel before it where
`dependent_launch` allows, as Triton launches `gemv_int4`. `kernels.linear` runs it (its
custom op asks `kernel_for` at run time, where the tensors are real) for one row of bf16
inputs over int4 weights in groups of 32 on sm_90 and later; the fused forms (norm
prologues, GELU and residual epilogues) still run `gemv_int4`, and other GPUs (the T4's
fp16, the L4, where it is not yet measured) run `gemv_int4` throughout.

Why CUDA C: the mma's k slots take a lane's own group of inputs in any order, so no value
moves between lanes after the wait (Triton's layout conversions put 23-33 barriers
there in `gemv_int4`). Measured in benchmarks/records/2026-12-06-h100-split-residual-cuda-gemv.md
and 2026-12-06-h100-cuda-int4-served.md.

A device or library that cannot build it makes `kernel_for` None, once, with a logged
line; the product then runs `gemv_int4`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path

import torch

from contract.errors import BenchError
from engines.pytorch import dependent_launch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int4_mma.cu")
KERNEL = "w4a16_gemv"
GROUP = 32
CHUNK = 128  # inputs a warp takes at a time: four groups
ROWS_A_BLOCK = 16
MAX_CHUNKS_A_WARP = 12  # a warp holds its chunks' words in registers before its wait
# Warps a block over the same 16 rows, as `benchmarks/int4_cuda_gemv_h200.py` measured
# best for E2B's shapes on an H100 (the H200's SM), by (N, K); other shapes take the rule
# in `split`.
MEASURED_SPLITS = {
    (2560, 1536): 12, (5120, 1536): 6, (2048, 1536): 12, (4096, 1536): 6,
    (1536, 2048): 16, (1536, 4096): 16, (12288, 1536): 3, (24576, 1536): 12,
    (1536, 6144): 16, (1536, 12288): 12, (256, 1536): 12, (1536, 256): 1,
    (8960, 1536): 3, (262144, 1536): 6,
}  # fmt: skip
# Served from this compute capability on: the source builds for sm_80 (bf16 mma), but it
# has been measured against `gemv_int4` only on sm_90 (H100; the H200 has its SM).
MEASURED_ON = (9, 0)
# The rule's aim: warps a launch (blocks times split) of at least this many.
WARPS_A_LAUNCH = 2048
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


def splits(k: int) -> list[int]:
    """The warps a block over 16 rows that divide a row of K inputs into whole chunks,
    at most `MAX_CHUNKS_A_WARP` a warp."""
    chunks = k // CHUNK
    return [s for s in range(1, 17) if chunks % s == 0 and chunks // s <= MAX_CHUNKS_A_WARP]


def split(n: int, k: int) -> int:
    """The measured split of (N, K), else the fewest warps a block that make a launch of
    `WARPS_A_LAUNCH` warps (the most there are where none does)."""
    allowed = splits(k)
    measured = MEASURED_SPLITS.get((n, k))
    if measured in allowed:
        return measured
    blocks = -(-n // ROWS_A_BLOCK)
    return next((s for s in allowed if blocks * s >= WARPS_A_LAUNCH), allowed[-1])


def shape_fits(n: int, k: int, group: int) -> bool:
    """Whether the kernel takes an (N, K) weight in groups of `group`."""
    return group == GROUP and k % CHUNK == 0 and bool(splits(k)) and n > 0


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(LaunchAttribute)),
        ("count", ctypes.c_uint),
    ]


class BuildError(BenchError):
    """NVRTC or the driver could not build or load the kernel on this device."""


def nvrtc_library() -> ctypes.CDLL:
    """The NVRTC library torch's CUDA build loads, else the `nvidia-cuda-nvrtc` wheel's
    (a CPU build of torch has none of its own: the tests compile the source with it)."""
    import torch.cuda._utils as cuda_utils

    try:
        return cuda_utils._get_gpu_rtc_library()
    except (OSError, AttributeError):
        pass
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(folder, "lib").glob("libnvrtc.so.*")):
            if "builtins" not in lib.name and ".alt." not in lib.name:
                return ctypes.CDLL(str(lib))
    raise BuildError("no NVRTC library: torch's CUDA build or nvidia-cuda-nvrtc has one")


def cubin(text: str, arch: str) -> bytes:
    """`text` (CUDA C, no headers) compiled by NVRTC for sm_`arch`."""
    nvrtc = nvrtc_library()
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"int4_mma.cu", 0, None, None):
        raise BuildError("NVRTC could not create the program")
    try:
        options = [f"--gpu-architecture=sm_{arch}".encode(), b"-default-device"]
        array = (ctypes.c_char_p * len(options))(*options)
        if nvrtc.nvrtcCompileProgram(prog, len(options), array):
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log_text = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(prog, log_text)
            raise BuildError(f"NVRTC: {log_text.value.decode().strip()}")
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        image = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(prog, image)
        return image.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


def substituted(path: Path, values: Iterable[tuple[str, object]]) -> str:
    """The CUDA C at `path` with each `__NAME__` placeholder replaced by its value."""
    text = path.read_text()
    for name, value in values:
        text = text.replace(f"__{name}__", str(value))
    return text


def source(k: int, split_warps: int) -> str:
    return substituted(SOURCE, (("K", k), ("SPLIT", split_warps), ("X_LOAD", "__ldg")))


class Kernel:
    """One build of `KERNEL` (a cubin image), loaded into `device`'s context; a launch
    takes `rows_a_block` rows a block of `threads`, and is a programmatic dependent of the
    kernel before it where `dependent_launch` allows."""

    def __init__(self, image: bytes, device: torch.device, rows_a_block: int, threads: int):
        import torch.cuda._utils as cuda_utils

        self.driver = cuda_utils._get_gpu_runtime_library()
        self.module = ctypes.c_void_p()
        self.func = ctypes.c_void_p()
        with torch.cuda.device(device):
            self._check(self.driver.cuModuleLoadData(ctypes.byref(self.module), image), "load")
            self._check(
                self.driver.cuModuleGetFunction(
                    ctypes.byref(self.func), self.module, KERNEL.encode()
                ),
                "get function",
            )
        self.rows_a_block = rows_a_block
        self.threads = threads
        self.attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attr.value[0] = 1

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self.driver.cuGetErrorName(code, ctypes.byref(name))
            raise BuildError(f"{what}: CUDA driver error {code} ({(name.value or b'').decode()})")

    def __call__(
        self, packed: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> None:
        """y = x @ dequantize(packed, scale)^T, into `y`."""
        n = packed.shape[0]
        config = LaunchConfig()
        config.grid[:] = (-(-n // self.rows_a_block), 1, 1)
        config.block[:] = (self.threads, 1, 1)
        config.stream = torch.cuda.current_stream(x.device).cuda_stream
        if dependent_launch.enabled(x.device):
            config.attrs = ctypes.pointer(self.attr)
            config.count = 1
        args = [ctypes.c_void_p(t.data_ptr()) for t in (packed, scale, x, y)] + [ctypes.c_int(n)]
        params = (ctypes.c_void_p * len(args))(
            *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args]
        )
        self._check(
            self.driver.cuLaunchKernelEx(ctypes.byref(config), self.func, params, None), "launch"
        )

    def product(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x (1, K) @ dequantize(packed, scale)^T as (1, N)."""
        y = torch.empty(1, packed.shape[0], dtype=x.dtype, device=x.device)
        self(packed, scale, x, y)
        return y


@functools.cache
def _kernel(device: torch.device, k: int, split_warps: int) -> Kernel | None:
    major, minor = torch.cuda.get_device_capability(device)
    try:
        image = cubin(source(k, split_warps), f"{major}{minor}")
        return Kernel(image, device, ROWS_A_BLOCK, 32 * split_warps)
    except (BuildError, OSError, AttributeError) as exc:
        log.warning(
            "int4: the CUDA C product does not build here (%s); gemv_int4 runs instead", exc
        )
        return None


def _aligned(t: torch.Tensor, bytes_: int) -> bool:
    return t.is_contiguous() and t.data_ptr() % bytes_ == 0


def kernel_for(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> Kernel | None:
    """The build that takes this product, if one does: one bf16 row on sm_90 or later,
    bf16 scales in groups of 32, rows contiguous and 16-byte aligned, and the kernel
    builds; else None."""
    if x.device.type != "cuda" or x.shape[0] != 1 or x.dtype != torch.bfloat16:
        return None
    if scale.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x.device) < MEASURED_ON:
        return None
    n, k = packed.shape[0], x.shape[1]
    if packed.shape[1] * 8 != k or not shape_fits(n, k, k // scale.shape[1]):
        return None
    if not (_aligned(packed, 16) and _aligned(scale, 2) and _aligned(x, 16)):
        return None
    return _kernel(x.device, k, split(n, k))
