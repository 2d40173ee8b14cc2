"""The batch-1 int4 product on the tensor cores, written in CUDA C (`int4_mma.cu`, whose
header says how it computes), with the fused forms the decode program uses (`gemv_forms`:
the norm scaled after the product, the residual step before it, the GELU gates and the
residual step after it): compiled at first use for the device's SM by NVRTC (the library
torch's CUDA wheels carry), loaded through the driver, and launched by
`cuLaunchKernelEx`, as a programmatic dependent of the kernel before it where
`dependent_launch` allows, as Triton launches `gemv_int4`. `kernels` asks `product_for`
at run time (inside its custom ops, where the tensors are real) for one row of bf16
inputs over int4 weights in groups of 32 on sm_90 and later; other forms, and other GPUs
(the T4's fp16, the L4, where it is not yet measured), run `gemv_int4`.

Why CUDA C: the mma's k slots take a lane's own group of inputs in any order, so no value
moves between lanes after the wait (Triton's layout conversions put 23-33 barriers
there in `gemv_int4`). Measured in benchmarks/records/2026-12-06-h100-split-residual-cuda-gemv.md
and 2026-12-06-h100-cuda-int4-served.md.

A device or library that cannot build it makes `product_for` None, once a build, with a
logged line; the product then runs `gemv_int4`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from contract.errors import BenchError
from engines.pytorch import dependent_launch
from engines.pytorch.gemv_forms import (
    GELU_PAIR,
    GELU_TIMES,
    NO_EPILOGUE,
    PLAIN,
    RESIDUAL,
    RESIDUAL_AFTER,
    RMS_NORM_AFTER,
)

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int4_mma.cu")
COMMON = Path(__file__).with_name("int4_mma_common.cuh")  # the helpers every such kernel uses
KERNEL = "w4a16_gemv"
GROUP = 32
CHUNK = 128  # inputs a warp takes at a time: four groups
ROWS_A_BLOCK = 16
MAX_CHUNKS_A_WARP = 12  # a warp holds its chunks' words in registers before its wait
# The prologues it builds (`gemv_forms`); every epilogue, but the residual step after
# the product reads the residual row where the residual step before it reads the branch.
PROLOGUES = (PLAIN, RESIDUAL, RMS_NORM_AFTER)
# The residual steps (prologue 3, epilogue 3) hold a whole row in registers, 16 bytes of
# each of three rows a vector: at most this many vectors a thread.
MAX_ROW_VECTORS_A_THREAD = 8
# Warps a block over the same 16 rows, as `benchmarks/int4_cuda_gemv_h200.py` measured
# best for E2B's shapes on an H100 (the H200's SM), by (weight rows, K), for the plain
# product; other shapes take the rule in `split`.
MEASURED_SPLITS = {
    (2560, 1536): 12, (5120, 1536): 6, (2048, 1536): 12, (4096, 1536): 6,
    (1536, 2048): 16, (1536, 4096): 16, (12288, 1536): 3, (24576, 1536): 12,
    (1536, 6144): 16, (1536, 12288): 12, (256, 1536): 12, (1536, 256): 1,
    (8960, 1536): 3, (262144, 1536): 6,
}  # fmt: skip
# The fused forms are served at the shapes where they were measured faster than
# `gemv_int4` (`benchmarks/int4_cuda_forms_h200.py`, an H100), with the split measured
# fastest there, by (prologue, epilogue, N outputs, K); elsewhere `gemv_int4` runs them:
# the norm scaled after q/k/v, the residual step after o and the per-layer projection
# and the double-wide gate/up pair lost or tied (records:
# benchmarks/records/2026-12-06-h100-cuda-int4-forms.md).
MEASURED_FORMS = {
    (RESIDUAL, GELU_TIMES, 256, 1536): 12,  # the per-layer gate
    (RMS_NORM_AFTER, GELU_PAIR, 6144, 1536): 4,  # gate/up of the layers with their own K/V
    (RMS_NORM_AFTER, NO_EPILOGUE, 262144, 1536): 3,  # the LM head
}
# Served from this compute capability on: the source builds for sm_80 (bf16 mma), but it
# has been measured against `gemv_int4` only on sm_90 (H100; the H200 has its SM).
MEASURED_ON = (9, 0)
# The rule's aim: warps a launch (blocks times split) of at least this many.
WARPS_A_LAUNCH = 2048
PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


def splits(k: int, tiles: int = 1) -> list[int]:
    """The warps a block over 16 rows (of each of `tiles` weights: two for a GELU pair)
    that divide a row of K inputs into whole chunks, at most `MAX_CHUNKS_A_WARP` chunks of
    rows a warp."""
    chunks = k // CHUNK
    return [s for s in range(1, 17) if chunks % s == 0 and chunks // s * tiles <= MAX_CHUNKS_A_WARP]


def split(n: int, k: int, tiles: int = 1) -> int:
    """The measured split of the weight's (N * tiles, K) rows, else the fewest warps a
    block that make a launch of `WARPS_A_LAUNCH` warps (the most there are where none
    does). A GELU pair takes as many chunks of rows a warp as the plain product over its
    merged weight: twice its warps."""
    allowed = splits(k, tiles)
    measured = MEASURED_SPLITS.get((n * tiles, k))
    if measured is not None:
        return next((s for s in allowed if s >= measured * tiles), allowed[-1])
    blocks = -(-n // ROWS_A_BLOCK)
    return next((s for s in allowed if blocks * s >= WARPS_A_LAUNCH), allowed[-1])


def form_split(prologue: int, epilogue: int, n: int, k: int) -> int | None:
    """The warps a block of the build that serves this form and shape, or None where
    `gemv_int4` does: `split` for the plain product, `MEASURED_FORMS` for a fused one."""
    if (prologue, epilogue) == (PLAIN, NO_EPILOGUE):
        return split(n, k)
    return MEASURED_FORMS.get((prologue, epilogue, n, k))


def shape_fits(n: int, k: int, group: int, tiles: int = 1) -> bool:
    """Whether the kernel takes N outputs of K inputs in groups of `group`."""
    return group == GROUP and k % CHUNK == 0 and bool(splits(k, tiles)) and n > 0


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


def cuda_source(path: Path, values: Iterable[tuple[str, object]]) -> str:
    """A tensor-core int4 kernel's text to compile: `COMMON`'s helpers, then `path`
    substituted."""
    return COMMON.read_text() + "\n" + substituted(path, values)


@dataclass(frozen=True)
class Build:
    """One compiled form of `KERNEL`: N outputs of K inputs, `split` warps a block, the
    fused prologue and epilogue (`gemv_forms`), and whether the residual step takes a
    scalar."""

    n: int
    k: int
    split: int
    prologue: int = PLAIN
    epilogue: int = NO_EPILOGUE
    scale: bool = False

    def source(self) -> str:
        values = (
            ("N", self.n), ("K", self.k), ("SPLIT", self.split), ("X_LOAD", "__ldg"),
            ("PROLOGUE", self.prologue), ("EPILOGUE", self.epilogue), ("SCALE", int(self.scale)),
        )  # fmt: skip
        return cuda_source(SOURCE, values)

    @property
    def blocks(self) -> int:
        return -(-self.n // ROWS_A_BLOCK)

    @property
    def threads(self) -> int:
        return 32 * self.split


Argument = torch.Tensor | int | float


class Kernel:
    """One cubin's `name` kernel loaded into `device`'s context; a launch is a
    programmatic dependent of the kernel before it where `dependent_launch` allows."""

    def __init__(self, image: bytes, device: torch.device, name: str = KERNEL):
        import torch.cuda._utils as cuda_utils

        self.driver = cuda_utils._get_gpu_runtime_library()
        self.module = ctypes.c_void_p()
        self.func = ctypes.c_void_p()
        with torch.cuda.device(device):
            self._check(self.driver.cuModuleLoadData(ctypes.byref(self.module), image), "load")
            self._check(
                self.driver.cuModuleGetFunction(
                    ctypes.byref(self.func), self.module, name.encode()
                ),
                "get function",
            )
        self.attr = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attr.value[0] = 1

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self.driver.cuGetErrorName(code, ctypes.byref(name))
            raise BuildError(f"{what}: CUDA driver error {code} ({(name.value or b'').decode()})")

    def launch(self, blocks: int | tuple[int, int], threads: int, args: Sequence[Argument]) -> None:
        """`blocks` blocks (x, or x and y) of `threads` on the current stream of the first
        tensor's device; tensors pass as their addresses, ints as int, floats as float."""
        device = next(a for a in args if isinstance(a, torch.Tensor)).device
        grid_x, grid_y = (blocks, 1) if isinstance(blocks, int) else blocks
        config = LaunchConfig()
        config.grid[:] = (grid_x, grid_y, 1)
        config.block[:] = (threads, 1, 1)
        config.stream = torch.cuda.current_stream(device).cuda_stream
        if dependent_launch.enabled(device):
            config.attrs = ctypes.pointer(self.attr)
            config.count = 1
        values = [
            ctypes.c_void_p(a.data_ptr())
            if isinstance(a, torch.Tensor)
            else ctypes.c_int(a)
            if isinstance(a, int)
            else ctypes.c_float(a)
            for a in args
        ]
        params = (ctypes.c_void_p * len(values))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
        )
        self._check(
            self.driver.cuLaunchKernelEx(ctypes.byref(config), self.func, params, None), "launch"
        )


class Operands(NamedTuple):
    """What a fused form reads besides the input and the weight (`kernels`' names): the
    branch (prologue 3) or the residual row (epilogue 3) as `other`, the norm weight of
    prologue 5, the branch's norm weight, the scalar, the new residual row's buffer, the
    multiplier of epilogue 2, and the launch counter of epilogue 3."""

    other: torch.Tensor | None = None
    norm_weight: torch.Tensor | None = None
    branch_norm: torch.Tensor | None = None
    scalar: torch.Tensor | None = None
    x_out: torch.Tensor | None = None
    multiplier: torch.Tensor | None = None
    counter: torch.Tensor | None = None
    eps: float = 0.0


NO_OPERANDS = Operands()


class Product:
    """A loaded build, launched over one row."""

    def __init__(self, build: Build, kernel: Kernel):
        self.build = build
        self.kernel = kernel

    def __call__(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        y: torch.Tensor,
        operands: Operands = NO_OPERANDS,
    ) -> None:
        """y = the fused form of x @ dequantize(packed, scale)^T, into `y` (and the new
        residual row into `operands.x_out`, where the form makes one)."""
        # The kernel takes every tensor operand in `Operands`' order; x stands in for absent ones.
        pointers = [x if t is None else t for t in operands[:-1]]
        self.kernel.launch(
            self.build.blocks, self.build.threads, [packed, scale, x, y, *pointers, operands.eps]
        )

    def product(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x (1, K) @ dequantize(packed, scale)^T as (1, N), for the plain build."""
        y = torch.empty(1, self.build.n, dtype=x.dtype, device=x.device)
        self(x, packed, scale, y)
        return y


def loaded(
    build: object, source: str, device: torch.device, name: str, instead: str
) -> Kernel | None:
    """`source`'s `name` kernel compiled for `device`'s SM and loaded, or None (with a
    logged line naming `build` and the kernel that runs `instead`) where it does not
    build."""
    major, minor = torch.cuda.get_device_capability(device)
    try:
        return Kernel(cubin(source, f"{major}{minor}"), device, name)
    except (BuildError, OSError, AttributeError) as exc:
        log.warning(
            "int4: the CUDA C product %s does not build here (%s); %s runs instead",
            build,
            exc,
            instead,
        )
        return None


@functools.cache
def _product(device: torch.device, build: Build) -> Product | None:
    kernel = loaded(build, build.source(), device, KERNEL, "gemv_int4")
    return None if kernel is None else Product(build, kernel)


def _aligned(t: torch.Tensor, bytes_: int) -> bool:
    return t.is_contiguous() and t.data_ptr() % bytes_ == 0


def operands_fit(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """What every tensor-core int4 product here reads: `operand_kinds_fit` and
    `operands_placed`."""
    return operand_kinds_fit(x, packed, scale) and operands_placed(x, packed, scale)


def operands_placed(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """Where the operands are (what a trace does not see): on a CUDA device of
    `MEASURED_ON` or later, x and the weight contiguous, x and the words 16-byte aligned."""
    if not device_fits(x.device.index or 0):
        return False
    return _aligned(packed, 16) and _aligned(scale, 2) and _aligned(x, 16)


def operand_kinds_fit(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    """What the operands must be, as a trace sees them (shapes and kinds, no addresses):
    bf16 rows of K inputs on CUDA, int4 weights of K inputs with bf16 scales in groups
    of `GROUP`."""
    if x.device.type != "cuda" or x.dtype != torch.bfloat16 or scale.dtype != torch.bfloat16:
        return False
    k = x.shape[-1]
    return packed.shape[1] * 8 == k and k // scale.shape[1] == GROUP


@functools.cache
def device_fits(index: int) -> bool:
    """Whether CUDA device `index` is of `MEASURED_ON` or later."""
    return torch.cuda.get_device_capability(index) >= MEASURED_ON


def _form_fits(build: Build, operands: Operands) -> bool:
    if build.prologue not in PROLOGUES:
        return False
    if build.prologue == RESIDUAL and build.epilogue == RESIDUAL_AFTER:
        return False  # `other` is the branch of one and the residual row of the other
    # The row a residual step reads in 16-byte vectors: K before the product, N after.
    row = build.k if build.prologue == RESIDUAL else build.n
    if build.prologue == RESIDUAL or build.epilogue == RESIDUAL_AFTER:
        if row % 8 or -(-row // 8 // build.threads) > MAX_ROW_VECTORS_A_THREAD:
            return False
        row_operands = (operands.other, operands.branch_norm, operands.x_out)
        if any(t is None or not _aligned(t, 16) for t in row_operands):
            return False
    return operands.norm_weight is None or _aligned(operands.norm_weight, 16)


def product_for(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    prologue: int = PLAIN,
    epilogue: int = NO_EPILOGUE,
    operands: Operands = NO_OPERANDS,
) -> Product | None:
    """The build that takes this product, if one does: one bf16 row on sm_90 or later,
    bf16 scales in groups of 32 and bf16 operands, rows contiguous and 16-byte aligned, a
    form it builds, and the kernel builds; else None."""
    if x.shape[0] != 1 or not operands_fit(x, packed, scale):
        return None
    tiles = 2 if epilogue == GELU_PAIR else 1
    n, k = packed.shape[0] // tiles, x.shape[1]
    if not shape_fits(n, k, k // scale.shape[1], tiles):
        return None
    given = [t for t in operands[:-2] if t is not None]  # the counter is int32, eps a float
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in given):
        return None
    split_warps = form_split(prologue, epilogue, n, k)
    if split_warps is None or split_warps not in splits(k, tiles):
        return None
    build = Build(n, k, split_warps, prologue, epilogue, operands.scalar is not None)
    return _product(x.device, build) if _form_fits(build, operands) else None
