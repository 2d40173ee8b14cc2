"""E2B's projections at a few rows (issue 18's small-batch path): each shape as a chain
over weight copies past L2 in one CUDA graph (as `benchmarks.int4_h200` times them),
through cuBLAS on bf16 weights, Triton's `matmul_int4` and `cuda_int4_rows`' CUDA C
product (`engines/pytorch/int4_mma_rows.cu`) at each configuration of a search, side by
side in one run. Each build's result is checked against dequantize-then-matmul before it
is timed; the step's sum weights each shape by its count. `--table` writes the builds
that beat `matmul_int4` as the engine's table (`cuda_int4_rows.TABLE`).

    python -m benchmarks.int4_cuda_gemm_h200 --build DIR --rows 8,16,32,64   # nvcc, sm_90
    python -m benchmarks.int4_cuda_gemm_h200 [--cubins DIR] [--rows 64] [--out result.json]
        [--table engines/pytorch/int4_rows_configs.json]

Without --cubins the builds are compiled on the GPU machine by NVRTC (torch's own).
Prints a table; needs a CUDA device of compute capability 9.0.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest import mock

from engines.pytorch import cuda_int4, cuda_int4_rows
from engines.pytorch.cuda_int4_rows import Build, Config

GROUP = 32
SMS = 132  # an H100's and an H200's: split K only where the row blocks leave SMs idle
MAX_ERR = 0.02  # of the largest output: a build whose result is further off is not timed
SERVE_BELOW = 0.97  # of matmul_int4's time: what a build must reach to enter the table


# From 32 rows on, (fragments a warp, warps a set of fragments) beyond one and one: two
# fragments a warp for outputs of 8,192 rows or more (the only shape it won at first was
# the LM head's), and the batch split between a set's warps, which trades X's
# shared-memory reads an mma (what a chunk costs there) for dequantizing the same weights
# in more warps, at two stages only.
WIDE_FORMS = ((2, 1), (2, 2), (4, 2), (4, 4))


def configs(n: int, k: int, rows: int) -> list[Config]:
    """The search at ROWS rows: the builds the source takes (`cuda_int4_rows.fits`),
    splitting K until the blocks would fill the SMs twice; from 32 rows on, no fourth
    stage, the forms of `WIDE_FORMS` and blocks of 16 warps (X staged once a block for
    more weight rows, at 128 registers a thread)."""
    wide, tiles = rows > 16, cuda_int4_rows.tiles_for(rows)
    forms = [(1, 1)]
    if wide:
        forms += [(rw, bs) for rw, bs in WIDE_FORMS if bs > 1 or n >= 8192]
    found = []
    for (rw, batch_split), warps, split_k in itertools.product(
        forms, (4, 8, 16) if wide else (4, 8), (1, 2, 3, 4, 6, 8, 12, 16)
    ):
        for stages in (2, 3, 4) if not wide else (2, 3) if batch_split == 1 else (2,):
            build = Build(n, k, tiles, Config(warps, split_k, stages, rw, batch_split))
            if cuda_int4_rows.fits(build) and (
                split_k == 1 or build.blocks[0] * split_k // 2 < SMS
            ):
                found.append(build.config)
    return found


def cubin_name(n: int, k: int, rows: int, cfg: Config) -> str:
    return f"gemm_n{n}_k{k}_m{rows}_{cfg.name()}.cubin"


def build(out: Path, shapes: list[tuple[int, int]], rows: list[int]) -> int:
    """Every configuration of every shape and row count as an sm_90 cubin, by nvcc (on a
    machine without a GPU)."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        (n, k, m, cfg) for n, k in sorted(set(shapes)) for m in rows for cfg in configs(n, k, m)
    ]
    with tempfile.TemporaryDirectory() as tmp:

        def one(job: tuple[int, int, int, Config]) -> None:
            cu = Path(tmp) / (cubin_name(*job) + ".cu")
            n, k, m, cfg = job
            cu.write_text(Build(n, k, cuda_int4_rows.tiles_for(m), cfg).source())
            target = out / cubin_name(*job)
            subprocess.run(
                ["nvcc", "-cubin", "-arch=sm_90", "-O3", "-o", str(target), str(cu)], check=True
            )

        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(one, jobs))
    return len(jobs)


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
    # `matmul_int4` alone: the table being measured may already serve this shape.
    triton_only = mock.patch.object(cuda_int4_rows, "product_for", lambda *args: None)
    with triton_only:
        triton_y = kernels.linear(x, (packed, scale))
    out["triton_err"] = float((triton_y.float() - ref).abs().max()) / top

    def engine() -> None:
        with triton_only:
            for w in weights:
                kernels.linear(x, w)

    def cublas() -> None:
        for w in denses:
            torch.matmul(x, w.T)

    out["triton_us"] = _timed_graph(engine) / copies * 1e6
    out["bf16_us"] = _timed_graph(cublas) / dense_copies * 1e6
    denses.clear()
    tried: list[dict[str, Any]] = []
    for cfg in configs(n, k, rows):
        entry: dict[str, Any] = {"config": cfg.name()}
        tried.append(entry)
        try:
            build = Build(n, k, cuda_int4_rows.tiles_for(rows), cfg)
            image = (
                (cubins / cubin_name(n, k, rows, cfg)).read_bytes()
                if cubins is not None
                else cuda_int4.cubin(build.source(), "90")
            )
            kernel = cuda_int4.Kernel(image, x.device, cuda_int4_rows.KERNEL)
            product = cuda_int4_rows.Product(build, kernel, x.device)
            y = product(x, packed, scale)
            torch.cuda.synchronize()
            entry["err"] = float((y.float() - ref).abs().max()) / top
            if entry["err"] >= MAX_ERR:
                continue

            def chain(product: cuda_int4_rows.Product = product) -> None:
                for wq, ws in weights:
                    product(x, wq, ws)

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
    p.add_argument("--table", type=Path, help="write the builds that beat matmul_int4 here")
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
            # Written after each shape: a run cut short keeps what it measured.
            _write(args, lines, results)
        lines.append(
            "step's products, ms: " + ", ".join(f"{key} {us / 1e3:.3f}" for key, us in step.items())
        )
        _write(args, lines, results)
    print("\n".join(lines))
    return 0


def _write(args: argparse.Namespace, lines: list[str], results: list[dict[str, Any]]) -> None:
    import torch

    gpu = torch.cuda.get_device_name()
    if args.out:
        result = {"gpu": gpu, "shapes": results, "table": "\n".join(lines)}
        args.out.write_text(json.dumps(result, indent=1))
    if args.table:
        table = served_table(results, args.table, gpu)
        args.table.write_text(json.dumps(table, indent=1) + "\n")


def served_table(results: list[dict[str, Any]], path: Path, gpu: str) -> dict[str, Any]:
    """`cuda_int4_rows.TABLE`'s text: each measured (row bucket, N, K) whose best build
    took under `SERVE_BELOW` of `matmul_int4`'s time, and that build; what this run did
    not measure (other row buckets, or shapes a run cut short did not reach) keeps its
    entry of the table at `path`."""

    def key(r: dict[str, Any]) -> str:
        return f"{cuda_int4_rows.tiles_for(r['rows'])},{r['N']},{r['K']}"

    measured = {key(r) for r in results}
    kept = json.loads(path.read_text())["builds"] if path.exists() else {}
    builds = {k: name for k, name in kept.items() if k not in measured}
    builds |= {
        key(r): r["cuda_config"]
        for r in results
        if r.get("cuda_us", math.inf) < SERVE_BELOW * r["triton_us"]
    }
    return {"measured_on": gpu, "builds": dict(sorted(builds.items()))}


if __name__ == "__main__":
    raise SystemExit(main())
