"""The int4 product of a few rows (2 to 64) on the tensor cores, written in CUDA C
(`int4_mma_rows.cu`, whose header says how it computes): the batch-1 product's weight
layout and mma scheme (`cuda_int4`) with the rows of X staged in shared memory, so each
dequantized weight pair meets every row. Compiled, loaded and launched as `cuda_int4`'s
builds are (NVRTC at first use, `cuLaunchKernelEx`, a programmatic dependent where
`dependent_launch` allows).

`kernels` asks `product_for` at run time for the rows `matmul_int4` would take. It serves
a (row bucket, N, K) only where its table (`TABLE`, written by
`benchmarks/int4_cuda_gemm_h200.py --table`) says it was measured faster than Triton's
`matmul_int4`, with the configuration measured fastest there; elsewhere, on GPUs before
`cuda_int4.MEASURED_ON` and where a build fails, `matmul_int4` runs.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engines.pytorch import cuda_int4

SOURCE = Path(__file__).with_name("int4_mma_rows.cu")
KERNEL = "w4a16_gemm"
TABLE = Path(__file__).with_name("int4_rows_configs.json")
ROWS_A_TILE = 8  # batch rows an mma's eight columns take
MAX_ROWS = 64


@dataclass(frozen=True)
class Config:
    """How a build splits the work: `warps` warps a block, each over `rw` fragments of 16
    weight rows; `split_k` blocks along K; `stages` chunks of weights in flight;
    `batch_split` warps to each set of fragments, each over its share of the row tiles."""

    warps: int
    split_k: int
    stages: int
    rw: int = 1
    batch_split: int = 1

    def name(self) -> str:
        split = f"_bs{self.batch_split}" if self.batch_split > 1 else ""
        return f"w{self.warps}_rw{self.rw}_sk{self.split_k}_st{self.stages}{split}"

    @classmethod
    def parse(cls, name: str) -> Config:
        """The configuration `name()` wrote."""
        found = re.fullmatch(r"w(\d+)_rw(\d+)_sk(\d+)_st(\d+)(?:_bs(\d+))?", name)
        if found is None:
            raise ValueError(f"not a configuration name: {name!r}")
        warps, rw, split_k, stages = (int(v) for v in found.groups()[:4])
        return cls(warps, split_k, stages, rw, int(found.group(5) or 1))


@dataclass(frozen=True)
class Build:
    """One compiled form: N outputs of K inputs, for at most 8 * `tiles` rows."""

    n: int
    k: int
    tiles: int
    config: Config

    def source(self) -> str:
        c = self.config
        values = (
            ("N", self.n), ("K", self.k), ("TILES", self.tiles), ("WARPS", c.warps),
            ("SPLIT_K", c.split_k), ("STAGES", c.stages), ("RW", c.rw),
            ("BATCH_SPLIT", c.batch_split),
        )  # fmt: skip
        return cuda_int4.cuda_source(SOURCE, values)

    @property
    def blocks(self) -> tuple[int, int]:
        c = self.config
        return -(-self.n // (16 * c.rw * c.warps // c.batch_split)), c.split_k

    @property
    def threads(self) -> int:
        return 32 * self.config.warps

    @property
    def partial_floats(self) -> int:
        """The float32 partial sums a split-K launch writes (none without a split)."""
        c = self.config
        return c.split_k * self.tiles * ROWS_A_TILE * self.n if c.split_k > 1 else 0


@functools.cache
def measured() -> dict[tuple[int, int, int], Config]:
    """The served builds from `TABLE`: (row bucket as tiles of 8 rows, N, K) to the
    configuration measured fastest there, where it beat `matmul_int4`."""
    builds = json.loads(TABLE.read_text())["builds"]
    return {
        (tiles, n, k): Config.parse(name)
        for key, name in builds.items()
        for tiles, n, k in [(int(v) for v in key.split(","))]
    }


def tiles_for(rows: int) -> int:
    """The row bucket a product of `rows` rows runs in: tiles of 8 rows, a power of two."""
    tiles = -(-rows // ROWS_A_TILE)
    return 1 << (tiles - 1).bit_length()


def fits(build: Build) -> bool:
    """Whether the source takes the build: whole chunks of 128 inputs split evenly, whole
    stages a split, the warps and the row tiles split evenly between a set's warps."""
    chunks, c = build.k // cuda_int4.CHUNK, build.config
    return (
        build.k % cuda_int4.CHUNK == 0
        and chunks % c.split_k == 0
        and (chunks // c.split_k) % c.stages == 0
        and build.tiles * ROWS_A_TILE <= MAX_ROWS
        and build.tiles % c.batch_split == 0
        and c.warps % c.batch_split == 0
    )


class Product:
    """A loaded build and the buffers its launches share: the float32 partial sums and
    a counter a row block (zero between launches: the last block of a row block resets
    it), used one launch after another on the stream, as `matmul_int4`'s are."""

    def __init__(self, build: Build, kernel: cuda_int4.Kernel, device: torch.device):
        self.build = build
        self.kernel = kernel
        self.partial = torch.empty(max(build.partial_floats, 1), dtype=torch.float32, device=device)
        self.counters = torch.zeros(build.blocks[0], dtype=torch.int32, device=device)

    def __call__(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """x (rows, K) @ dequantize(packed, scale)^T as (rows, N)."""
        y = torch.empty(x.shape[0], self.build.n, dtype=x.dtype, device=x.device)
        args: list[cuda_int4.Argument] = [
            packed,
            scale,
            x,
            y,
            self.partial,
            self.counters,
            x.shape[0],
        ]
        self.kernel.launch(self.build.blocks, self.build.threads, args)
        return y


@functools.cache
def loaded_product(device: torch.device, build: Build) -> Product | None:
    """The build loaded on the device (once a process), or None where it does not build
    there; what `product_for` serves, and what a probe of one named build launches."""
    kernel = cuda_int4.loaded(build, build.source(), device, KERNEL, "matmul_int4")
    return None if kernel is None else Product(build, kernel, device)


def product_for(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> Product | None:
    """The build that takes x's rows (2 to 64 rows that `cuda_int4.operands_fit`) where
    `measured()` serves its shape; else None."""
    build = _served_build(x, packed, scale)
    if build is None or not cuda_int4.operands_placed(x, packed, scale):
        return None
    return loaded_product(x.device, build)


def _served_build(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> Build | None:
    if (
        x.dim() != 2
        or not 2 <= x.shape[0] <= MAX_ROWS
        or not cuda_int4.operand_kinds_fit(x, packed, scale)
    ):
        return None
    return _table_build(tiles_for(x.shape[0]), packed.shape[0], x.shape[1])


def _table_build(tiles: int, n: int, k: int) -> Build | None:
    config = measured().get((tiles, n, k))
    if config is None:
        return None
    build = Build(n, k, tiles, config)
    return build if fits(build) else None
