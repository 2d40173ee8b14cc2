"""A probe for issue 18's 64-row target: E2B's projections at ROWS rows (64 by default),
each shape as a chain over weight copies past L2 in one CUDA graph (as
`benchmarks.int4_h200` times them), through cuBLAS on bf16 weights, the engine's
`matmul_int4` (`kernels.linear`) and `benchmarks/int4_cuda_gemm.cu` (the engine's
batch-1 tensor-core scheme with the rows of X staged in shared memory; its header says
how) at each configuration of a small search, side by side in one run. Each build's
result is checked against dequantize-then-matmul before it is timed; the step's sum
weights each shape by its count.

    python -m benchmarks.int4_cuda_gemm_h200 --build DIR    # nvcc: sm_90 cubins into DIR
    python -m benchmarks.int4_cuda_gemm_h200 [--cubins DIR] [--rows 64] [--out result.json]

Without --cubins the builds are compiled on the GPU machine by NVRTC (torch's own).
Prints a table; needs a CUDA device of compute capability 9.0.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.pytorch import cuda_int4

SOURCE = Path(__file__).with_name("int4_cuda_gemm.cu")
GROUP = 32
SMS = 132  # an H100's and an H200's: split K only where the row blocks leave SMs idle
MAX_ERR = 0.02  # of the largest output: a build whose result is further off is not timed


@dataclass(frozen=True)
class Config:
    """One build: WARPS warps a block (16 weight rows each), SPLIT_K programs along K,
    STAGES chunks of weights in flight."""

    warps: int
    split_k: int
    stages: int

    def name(self) -> str:
        return f"w{self.warps}_sk{self.split_k}_st{self.stages}"

    def blocks(self, n: int) -> int:
        return -(-n // (16 * self.warps))


def configs(n: int, k: int) -> list[Config]:
    chunks = k // 128
    found = []
    for warps in (4, 8):
        for split_k in (1, 2, 4, 8):
            base = Config(warps, split_k, 1)
            if chunks % split_k or (split_k > 1 and base.blocks(n) * split_k // 2 >= SMS):
                continue
            found += [
                Config(warps, split_k, stages)
                for stages in (2, 3, 4)
                if (chunks // split_k) % stages == 0
            ]
    return found


def source(n: int, k: int, rows: int, cfg: Config) -> str:
    values = (
        ("N", n), ("K", k), ("TILES", -(-rows // 8)), ("WARPS", cfg.warps),
        ("SPLIT_K", cfg.split_k), ("STAGES", cfg.stages),
    )  # fmt: skip
    return cuda_int4.cuda_source(SOURCE, values)


def cubin_name(n: int, k: int, rows: int, cfg: Config) -> str:
    return f"gemm_n{n}_k{k}_m{rows}_{cfg.name()}.cubin"


def build(out: Path, shapes: list[tuple[int, int]], rows: list[int]) -> int:
    """Every configuration of every shape and row count as an sm_90 cubin, by nvcc (on a
    machine without a GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    with tempfile.TemporaryDirectory() as tmp:
        for n, k in sorted(set(shapes)):
            for m in rows:
                for cfg in configs(n, k):
                    cu = Path(tmp) / "gemm.cu"
                    cu.write_text(source(n, k, m, cfg))
                    target = out / cubin_name(n, k, m, cfg)
                    subprocess.run(
                        ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-o", str(target), str(cu)],
                        check=True,
                    )
                    count += 1
    return count


def _launcher(kernel: Any, grid: tuple[int, int], threads: int, x: Any, y: Any,
              extra: list[Any]) -> Callable[[Any, Any], None]:  # fmt: skip
    """launch(packed, scale): one product of X into Y."""
    return lambda wq, ws: kernel.launch(grid, threads, [wq, ws, x, y, *extra])


def shape_times(n: int, k: int, rows: int, cubins: Path | None) -> dict[str, Any]:
    import torch

    from benchmarks.gemv_h200 import MIN_STREAM_BYTES, _timed_graph
    from engines.pytorch import int4, kernels

    base = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    packed, scale = int4.quantize(base, GROUP)
    dense = int4.dequantize(packed, scale, torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ int4.dequantize(packed, scale, torch.float32).T
    top = float(ref.abs().max())
    nbytes = n * k // 2 + n * (k // GROUP) * 2
    copies = max(1, math.ceil(MIN_STREAM_BYTES / nbytes))
    dense_copies = max(1, math.ceil(MIN_STREAM_BYTES / (n * k * 2)))
    weights = [(packed.clone(), scale.clone()) for _ in range(copies)]
    denses = [dense.clone() for _ in range(dense_copies)]
    out: dict[str, Any] = {"N": n, "K": k, "rows": rows, "copies": copies, "mbytes": nbytes / 1e6}
    out["triton_err"] = float((kernels.linear(x, (packed, scale)).float() - ref).abs().max()) / top

    def engine() -> None:
        for w in weights:
            kernels.linear(x, w)

    def cublas() -> None:
        for w in denses:
            torch.matmul(x, w.T)

    out["triton_us"] = _timed_graph(engine) / copies * 1e6
    out["bf16_us"] = _timed_graph(cublas) / dense_copies * 1e6
    denses.clear()
    tried: list[dict[str, Any]] = []
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    for cfg in configs(n, k):
        entry: dict[str, Any] = {"config": cfg.name()}
        tried.append(entry)
        try:
            image = (
                (cubins / cubin_name(n, k, rows, cfg)).read_bytes()
                if cubins is not None
                else cuda_int4.cubin(source(n, k, rows, cfg), "90")
            )
            kernel = cuda_int4.Kernel(image, x.device, "w4a16_gemm")
            tiles = -(-rows // 8)
            partial = torch.empty(cfg.split_k * tiles * 8 * n, device="cuda", dtype=torch.float32)
            counters = torch.zeros(cfg.blocks(n), device="cuda", dtype=torch.int32)
            grid = (cfg.blocks(n), cfg.split_k)

            launch = _launcher(kernel, grid, 32 * cfg.warps, x, y, [partial, counters, rows])
            y.zero_()
            launch(packed, scale)
            torch.cuda.synchronize()
            entry["err"] = float((y.float() - ref).abs().max()) / top
            if entry["err"] >= MAX_ERR:
                continue

            def chain(launch: Any = launch) -> None:
                for wq, ws in weights:
                    launch(wq, ws)

            entry["us"] = _timed_graph(chain) / copies * 1e6
        except Exception as exc:  # recorded: a configuration that does not build or run
            entry["error"] = f"{type(exc).__name__}: {exc}"
    out["cuda_tried"] = tried
    fine = [t for t in tried if "us" in t]
    if fine:
        best = min(fine, key=lambda t: float(t["us"]))
        out["cuda_us"], out["cuda_config"], out["cuda_err"] = (
            best["us"],
            best["config"],
            best["err"],
        )
    weights.clear()
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.int4_cuda_gemm_h200", description=__doc__
    )
    p.add_argument("--build", type=Path, help="write sm_90 cubins here with nvcc, then stop")
    p.add_argument("--cubins", type=Path, help="cubins written by --build")
    p.add_argument("--rows", default="64", help="comma-separated row counts (at most 64)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from benchmarks.gemv_h200 import SHAPES

    rows = [int(r) for r in args.rows.split(",")]
    if any(not 1 <= r <= 64 for r in rows):
        p.error("--rows: each between 1 and 64")
    if args.build:
        shapes = [(n, k) for _, n, k, _ in SHAPES]
        print(f"{build(args.build, shapes, rows)} cubins in {args.build}")
        return 0
    import torch

    results = []
    lines = [f"{torch.cuda.get_device_name()}; us a product, chained over weights past L2"]
    for m in rows:
        lines += [
            f"{m} rows:",
            "| projection | count | bf16 cuBLAS | matmul_int4 | CUDA (config) | CUDA / "
            "matmul_int4 | CUDA / bf16 |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        step = {"bf16": 0.0, "triton": 0.0, "cuda": 0.0, "best_int4": 0.0}
        for name, n, k, count in SHAPES:
            r = shape_times(n, k, m, args.cubins)
            r.update(name=name, count=count)
            results.append(r)
            cuda = r.get("cuda_us", math.nan)
            print(name, m, {key: r.get(key) for key in ("bf16_us", "triton_us", "cuda_us",
                  "cuda_config", "cuda_err", "triton_err")}, flush=True)  # fmt: skip
            lines.append(
                f"| {name} {n}x{k} | {count} | {r['bf16_us']:.2f} | {r['triton_us']:.2f} | "
                f"{cuda:.2f} ({r.get('cuda_config')}) | {cuda / r['triton_us']:.2f} | "
                f"{cuda / r['bf16_us']:.2f} |"
            )
            step["bf16"] += r["bf16_us"] * count
            step["triton"] += r["triton_us"] * count
            step["cuda"] += cuda * count
            step["best_int4"] += min(r["triton_us"], r.get("cuda_us", math.inf)) * count
        lines.append(
            "step's products, ms: " + ", ".join(f"{key} {us / 1e3:.3f}" for key, us in step.items())
        )
    print("\n".join(lines))
    if args.out:
        result = {"gpu": torch.cuda.get_device_name(), "shapes": results, "table": "\n".join(lines)}
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
