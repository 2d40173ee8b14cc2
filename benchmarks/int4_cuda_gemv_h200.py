"""A probe for issue 18's batch-1 targets: E2B's projections at one row, each shape as a
chain of dependent launches over streamed weight copies in one CUDA graph (as
`benchmarks.int4_h200` times them), through the engine's `gemv_int4` (`kernels.linear`)
against torch's `_weight_int4pack_mm` (tinygemm), and through two CUDA C products:
`int4_cuda_gemv.cu` (float32 multiply-adds, no shared memory, no barrier) and
`engines/pytorch/int4_mma.cu` (the tensor cores, the engine's `cuda_int4` since
this probe; their headers say how). The engine's and the
CUDA kernels launch as programmatic dependents. Each CUDA kernel's configuration is the
fastest of a small search in the same run, a shape at a time; the step's chain is the
shapes' times weighted by their counts.

    python -m benchmarks.int4_cuda_gemv_h200 --build DIR      # nvcc: sm_90 cubins into DIR
    python -m benchmarks.int4_cuda_gemv_h200 [--cubins DIR] [--out result.json]

Without --cubins the kernels are compiled on the GPU machine by NVRTC (torch's own).
Prints a table; needs a CUDA device of compute capability 9.0. The float32 kernel is the
probe's own; the mma kernel's search here is where `cuda_int4.MEASURED_SPLITS` comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.pytorch import cuda_int4

SOURCES = {
    "fma": Path(__file__).with_name("int4_cuda_gemv.cu"),
    "mma": cuda_int4.SOURCE,
}
GROUP = 32
# Through L1 (`__ldg`): reading the input past L1 (`__ldcg`) lost on every shape in the
# first runs (2026-12-06-h100-split-residual-cuda-gemv.md).
X_LOAD = "__ldg"
MAX_ERR = 0.02  # of the largest output: a build whose result is further off is not timed
SUMMARY = ("triton_us", "fma_us", "fma_config", "mma_us", "mma_config", "cuda_err", "triton_err")


@dataclass(frozen=True)
class Config:
    """One build of a kernel: `fma` (int4_cuda_gemv.cu: LANES lanes a row, ROWS rows a
    lane, WARPS warps a block) or `mma` (the engine's int4_mma.cu: SPLIT warps over 16 rows)."""

    kernel: str
    values: tuple[tuple[str, int], ...]

    def rows_a_block(self) -> int:
        v = dict(self.values)
        return v["WARPS"] * (32 // v["LANES"]) * v["ROWS"]

    def threads(self) -> int:
        return 32 * dict(self.values)["WARPS"]

    def mma(self, n: int, k: int) -> cuda_int4.Build:
        return cuda_int4.Build(n, k, dict(self.values)["SPLIT"])

    def name(self) -> str:
        return self.kernel + "_" + "_".join(f"{k.lower()}{v}" for k, v in self.values)


def configs(k: int) -> Iterator[Config]:
    """Every build whose blocks divide a row of K inputs evenly."""
    groups = k // GROUP
    for lanes in (2, 4, 8, 16, 32):
        if groups % lanes:
            continue
        for rows in (1, 2, 4, 8):
            if groups // lanes * rows <= 24:
                for warps in (2, 4, 8):
                    yield Config("fma", (("LANES", lanes), ("ROWS", rows), ("WARPS", warps)))
    for split in cuda_int4.splits(k):
        yield Config("mma", (("SPLIT", split),))


def source(n: int, k: int, config: Config) -> str:
    if config.kernel == "mma":
        return config.mma(n, k).source()
    return cuda_int4.substituted(
        SOURCES[config.kernel], (("K", k), ("X_LOAD", X_LOAD), *config.values)
    )


def cubin_name(n: int, k: int, config: Config) -> str:
    # The mma kernel is built for its N too (a compile-time constant there).
    return f"{f'n{n}_' if config.kernel == 'mma' else ''}k{k}_{config.name()}.cubin"


def build(out: Path, shapes: list[tuple[int, int]]) -> int:
    """Every configuration of every (N, K) as an sm_90 cubin, by nvcc (on a machine
    without a GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, k in sorted(set(shapes)):
            for cfg in configs(k):
                cu = Path(tmp) / "gemv.cu"
                cu.write_text(source(n, k, cfg))
                subprocess.run(
                    [
                        "nvcc",
                        "-cubin",
                        "-arch=sm_90",
                        "-O3",
                        "-o",
                        str(out / cubin_name(n, k, cfg)),
                        str(cu),
                    ],
                    check=True,
                )
                count += 1
    return count


def _image(n: int, k: int, cfg: Config, cubins: Path | None) -> bytes:
    if cubins is not None:
        return (cubins / cubin_name(n, k, cfg)).read_bytes()
    return cuda_int4.cubin(source(n, k, cfg), "90")


def _launcher(n: int, k: int, cfg: Config, cubins: Path | None) -> Callable[..., None]:
    """launch(packed, scale, x, y) of one build."""
    import torch

    kernel = cuda_int4.Kernel(_image(n, k, cfg, cubins), torch.device("cuda"))
    if cfg.kernel == "mma":
        product = cuda_int4.Product(cfg.mma(n, k), kernel)
        return lambda wq, ws, x, y: product(x, wq, ws, y)
    blocks = -(-n // cfg.rows_a_block())
    return lambda wq, ws, x, y: kernel.launch(blocks, cfg.threads(), [wq, ws, x, y, n])


def shape_times(n: int, k: int, cubins: Path | None) -> dict[str, Any]:
    import torch

    from benchmarks.gemv_h200 import MIN_STREAM_BYTES, _timed_graph
    from benchmarks.int4_h200 import _tinygemm
    from engines.pytorch import int4, kernels

    nbytes = n * k // 2 + n * (k // GROUP) * 2
    copies = max(1, math.ceil(MIN_STREAM_BYTES / nbytes))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    base = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    packed, scale = int4.quantize(base, GROUP)
    ref = (x.float() @ int4.dequantize(packed, scale, torch.float32).T).flatten()
    top = float(ref.abs().max())
    weights = [(packed.clone(), scale.clone()) for _ in range(copies)]
    outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    out: dict[str, Any] = {"N": n, "K": k, "copies": copies, "mbytes": nbytes / 1e6}
    got = kernels.linear(x, (packed, scale)).float().flatten()
    out["triton_err"] = float((got - ref).abs().max()) / top
    tiles, sz = _tinygemm(base)
    torch_int4 = [(tiles.clone(), sz.clone()) for _ in range(copies)]

    def engine() -> None:
        for w in weights:
            kernels.linear(x, w)

    def tinygemm() -> None:
        for t, z in torch_int4:
            torch._weight_int4pack_mm(x, t, GROUP, z)

    out["triton_us"] = _timed_graph(engine) / copies * 1e6
    out["tinygemm_us"] = _timed_graph(tinygemm) / copies * 1e6
    torch_int4.clear()
    tried: list[dict[str, Any]] = []
    for cfg in configs(k):
        entry: dict[str, Any] = {"kernel": cfg.kernel, "config": cfg.name()}
        tried.append(entry)
        try:
            kernel = _launcher(n, k, cfg, cubins)
            y = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
            kernel(packed, scale, x, y)
            torch.cuda.synchronize()
            entry["err"] = float((y.float() - ref).abs().max()) / top

            def launch(kernel: Callable[..., None] = kernel) -> None:
                for (wq, ws), y in zip(weights, outs, strict=True):
                    kernel(wq, ws, x, y)

            entry["us"] = _timed_graph(launch) / copies * 1e6
        except Exception as exc:  # recorded: a configuration that does not build or run
            entry["error"] = f"{type(exc).__name__}: {exc}"
    out["cuda_tried"] = tried
    for name in (*SOURCES, None):
        fine = [
            t for t in tried if "us" in t and t["err"] < MAX_ERR and name in (None, t["kernel"])
        ]
        if fine:
            best = min(fine, key=lambda t: float(t["us"]))
            key = f"{name}_" if name else "cuda_"
            out[f"{key}us"], out[f"{key}config"], out[f"{key}err"] = (
                best["us"], best["config"], best["err"],
            )  # fmt: skip
    weights.clear()
    outs.clear()
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.int4_cuda_gemv_h200", description=__doc__
    )
    p.add_argument("--build", type=Path, help="write sm_90 cubins here with nvcc, then stop")
    p.add_argument("--cubins", type=Path, help="cubins written by --build")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from benchmarks.gemv_h200 import SHAPES

    if args.build:
        print(f"{build(args.build, [(n, k) for _, n, k, _ in SHAPES])} cubins in {args.build}")
        return 0
    import torch

    from engines.pytorch.stepbench import copy_bandwidth

    bw = copy_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    rows = []
    for name, n, k, count in SHAPES:
        r = shape_times(n, k, args.cubins)
        r.update(name=name, count=count)
        r["best_us"] = min(r["triton_us"], r.get("cuda_us", math.inf))
        rows.append(r)
        print(name, {key: r.get(key) for key in SUMMARY}, flush=True)
    impls = ("tinygemm", "triton", "fma", "mma", "cuda", "best")
    step = {i: sum(r.get(f"{i}_us", math.nan) * r["count"] for r in rows) / 1e3 for i in impls}
    roofline = sum(r["mbytes"] * 1e6 * r["count"] for r in rows) / bw * 1e3
    lines = [
        f"{torch.cuda.get_device_name()}, copy bandwidth {bw / 1e9:.0f} GB/s; one row, "
        "us a product (GB/s); each CUDA kernel at its fastest configuration",
        "| projection | count | MB | tinygemm | gemv_int4 | CUDA fma | CUDA mma | faster CUDA "
        "/ gemv_int4 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        mb = r["mbytes"]
        cells = [
            f"{r[f'{i}_us']:.2f} ({mb * 1e3 / r[f'{i}_us']:.0f})" if f"{i}_us" in r else "-"
            for i in ("tinygemm", "triton", "fma", "mma")
        ]
        ratio = r.get("cuda_us", math.nan) / r["triton_us"]
        lines.append(
            f"| {r['name']} {r['N']}x{r['K']} | {r['count']} | {mb:.2f} | "
            + " | ".join(cells)
            + f" | {ratio:.2f} |"
        )
    lines.append(
        "step chain ms: "
        + ", ".join(f"{i} {step[i]:.3f}" for i in impls)
        + f"; weights at copy bandwidth {roofline:.3f}"
    )
    lines.append(
        "tinygemm / step chain: "
        + ", ".join(f"{i} {step['tinygemm'] / step[i]:.2f}x" for i in impls[1:])
    )
    print("\n".join(lines))
    if args.out:
        result = {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_gb_s": bw / 1e9,
                  "shapes": rows, "step_ms": step, "table": "\n".join(lines)}  # fmt: skip
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
