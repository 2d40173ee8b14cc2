"""A planar int4 layout against the engine's int4 kernels and bf16 cuBLAS, at 64 rows and at
one row (issue 18; records: `benchmarks/records/2026-12-05-h100-matmul-int4-64-rows.md`).

The engine keeps compressed-tensors' layout: nibble i of word j is input 8j + i, so
`matmul_int4` interleaves the eight dequantized nibble tiles back into input order
before `tl.dot`, and that tile reaches the tensor cores through shared memory (stores,
barriers, `ldmatrix`). In the planar layout (`benchmarks.int4_planar_kernels`) word j of
each 128-input chunk holds inputs j, 16 + j, ..., 112 + j: nibble tile i is the 16 inputs
from 16 i, one dot of its own, and Triton loads the words straight into the dot's register
layout (built for sm_90: no shared-memory store in the loop). Its split-K adds into a
float32 output with atomics, a timing stand-in for the engine's ordered fix-up. At one
row, `planar_gemv` against `gemv_int4` says whether the batch-1 path could read the same
layout.

Each shape's weights stream from DRAM (copies past 256 MB, CUDA graphs, as
`benchmarks.int4_h200`); the planar kernels' block shapes are searched within the budget,
shared evenly by the shapes and row counts.

    python -m benchmarks.int4_planar_h200 [--rows 64,1] [--budget-s 230] [--out planar.json]
    TRITON_INTERPRET=1 python -m benchmarks.int4_planar_h200 --dry-run   # on a CPU
    python -m benchmarks.int4_planar_h200 --sass   # each main loop's SASS, on a CPU

Prints a table; needs a CUDA device with Triton (`--dry-run`, `--sass`: none).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import triton

from benchmarks.gemv_h200 import MIN_STREAM_BYTES, _timed_graph
from benchmarks.gemv_h200 import SHAPES as STEP_SHAPES
from benchmarks.int4_planar_kernels import CHUNK, planar_gemv, planar_int4, planar_pack

# The six projections of a decode step that the int4 products lose or win on at 64 rows.
SHAPES = tuple(
    (name, n, k)
    for name, n, k, _count in STEP_SHAPES
    if name in ("qkv sliding", "o sliding", "gate_up", "gate_up double", "down", "down double")
)


def run_planar(x: Any, words: Any, scale: Any, config: tuple, out: Any = None) -> Any:
    """x @ w^T. One row: config (BLOCK_N, BLOCK_K, warps), `planar_gemv`. More: config
    (BLOCK_M, BLOCK_N, SPLIT_K, CHUNKS, SCALE_VECTOR, warps, stages), `planar_int4`; with a
    split, `out` (float32) is zeroed and summed into."""
    import torch

    if len(config) == 3:
        block_n, block_k, warps = config
        out = torch.empty(1, words.shape[0], device=x.device, dtype=x.dtype) if out is None else out
        planar_gemv[(-(-words.shape[0] // block_n),)](
            x, words, scale, out, words.shape[0], x.shape[1], block_n, block_k, num_warps=warps
        )  # fmt: skip
        return out
    block_m, block_n, split, chunks, vector, warps, stages = config
    m, k = x.shape
    n = words.shape[0]
    if out is None:
        out = torch.empty(m, n, device=x.device, dtype=torch.float32 if split > 1 else x.dtype)
    if split > 1:
        out.zero_()
    grid = (-(-m // block_m), n // block_n, split)
    planar_int4[grid](x, words, scale, out, m, n, k, block_m, block_n, split, chunks, vector,
                 num_warps=warps, num_stages=stages)  # fmt: skip
    return out


def dry_run() -> list[dict[str, Any]]:
    """The planar layout's products against dequantize-then-matmul, in Triton's
    interpreter (float16: its bfloat16 dot is not exact)."""
    import torch

    from engines.pytorch import int4, triton_interpreter

    triton_interpreter.fix()
    torch.manual_seed(0)
    n, k, m = 64, 1536, 5
    packed, scale = int4.quantize((torch.randn(n, k) / k**0.5).to(torch.float16), 32)
    words = planar_pack(int4.unpack(packed, k))
    x = torch.randn(m, k, dtype=torch.float16)
    ref = x.float() @ int4.dequantize(packed, scale, torch.float32).T
    out = []
    matmul = ((64, 64, 1, 1, 0, 4, 1), (64, 64, 2, 1, 1, 4, 1), (64, 32, 2, 2, 1, 4, 1))
    for config in matmul:
        got = run_planar(x, words, scale, config).float()
        err = float((got - ref).abs().max() / ref.abs().max())
        out.append({"config": list(config), "max_err_over_max": err})
    # One row, in chunks that end past K (1,024 of 1,536 inputs) and that fit.
    x1 = x[:1].contiguous()
    ref1 = x1.float() @ int4.dequantize(packed, scale, torch.float32).T
    for config in ((8, 1024, 4), (16, 256, 2)):
        got = run_planar(x1, words, scale, config).float()
        err = float((got - ref1).abs().max() / ref1.abs().max())
        out.append({"config": list(config), "max_err_over_max": err})
    return out


def _configs(rows: int, n: int, k: int) -> list[tuple]:
    """The planar block shapes to try, most likely first (`run_planar`'s configs)."""
    if rows == 1:
        shapes = itertools.product((8, 4, 16, 2), (1024, 2048, 512, 4096, 8192, 256), (4, 2, 8))
        return [(bn, bk, w) for bn, bk, w in shapes if bn * bk // 8 // (32 * w) <= 64]
    splits = (1,) if n >= 8192 else (2, 4, 8)
    return [
        (64, block_n, split, chunks, vector, warps, stages)
        for chunks, stages, (block_n, warps), split, vector in itertools.product(
            (1, 2), (3, 4), ((64, 4), (128, 8)), splits, (0, 1)
        )
        if (k // CHUNK) % (split * chunks) == 0
    ]


def _shape_times(name: str, n: int, k: int, rows: int, seconds_left: float) -> dict[str, Any]:
    """One shape: cuBLAS, the engine's kernel, and the planar kernel's best block shape
    found within `seconds_left`."""
    import torch
    import torch.nn.functional as F

    from engines.pytorch import int4, kernels

    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    packed, scale = int4.quantize(w, 32)
    words = planar_pack(int4.unpack(packed, k))
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ kernels.dense((packed, scale), torch.float32).T
    copies = max(1, math.ceil(MIN_STREAM_BYTES / (n * k // 2 + n * k // 16)))
    ours = [(packed.clone(), scale.clone()) for _ in range(copies)]
    r: dict[str, Any] = {"name": name, "N": n, "K": k, "rows": rows}
    r["shipped_us"] = 1e6 * _timed_graph(lambda: [kernels.linear(x, o) for o in ours]) / copies
    ours.clear()
    dense_copies = max(1, math.ceil(MIN_STREAM_BYTES / (n * k * 2)))
    dense = [w.clone() for _ in range(dense_copies)]
    r["cublas_us"] = 1e6 * _timed_graph(lambda: [F.linear(x, d) for d in dense]) / len(dense)
    dense.clear()
    planar = [(words.clone(), scale.clone()) for _ in range(copies)]
    best: tuple | None = None
    deadline = time.monotonic() + seconds_left
    for config in _configs(rows, n, k):
        if time.monotonic() > deadline:
            break
        got = run_planar(x, words, scale, config).float()
        err = float((got - ref).abs().max() / ref.abs().max())
        split = config[2] if len(config) > 3 else 1
        y = torch.empty(rows, n, device="cuda", dtype=torch.float32 if split > 1 else x.dtype)
        us = 1e6 * _timed_graph(
            lambda c=config, y=y: [run_planar(x, a, b, c, y) for a, b in planar]
        ) / copies  # fmt: skip
        if best is None or us < best[0]:
            best = (us, list(config), err)
    r["planar_us"], r["planar_config"], r["planar_err"] = best or (None, None, None)
    planar.clear()
    torch.cuda.empty_cache()
    return r


def measure(rows: list[int], budget_s: float) -> list[dict[str, Any]]:
    each_s = budget_s / len(SHAPES) / len(rows)
    return [_shape_times(name, n, k, r, each_s) for r in rows for name, n, k in SHAPES]


# The instructions a chunk's path through memory shows in SASS: global loads (`LDG`,
# synchronous; `LDGSTS`, copied ahead), shared-memory loads and stores (`LDS`, `LDSM`,
# `STS`), barriers, tensor-core groups and byte permutes.
SASS_OPS = ("LDG", "LDGSTS", "LDS", "LDSM", "STS", "BAR", "HGMMA", "PRMT")


def _loop_mix(built: Any) -> dict[str, int]:
    from benchmarks.int4_issue_bound import main_loop, sass

    loop = main_loop(sass(built))
    ops = [(t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0] for t in loop]
    return {"loop": len(loop)} | {op: ops.count(op) for op in SASS_OPS}


def sass_mix(rows: int = 64) -> list[dict[str, Any]]:
    """Each shape's main loop built for sm_90 on this machine (no GPU): the shipped
    table's `matmul_int4` entry at `rows` against the planar kernel at 64 x 64 tiles,
    four warps, three stages, with each scale loaded alone and as one vector."""
    from triton.compiler import ASTSource

    from benchmarks.int4_issue_bound import SM90, build_matmul_int4
    from engines.pytorch import int4_tuning

    table = int4_tuning.pinned_tables().get("NVIDIA H200", {}).get("matmul_int4", {})
    signature = {"x_ptr": "*bf16", "wq_ptr": "*i32", "ws_ptr": "*bf16", "y_ptr": "*bf16",
                 "M": "i32", "N": "i32", "K": "i32"}  # fmt: skip
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))}
    out = []
    for name, n, k in SHAPES:
        label = table.get(f"64,{n},{k},32")
        if label:
            config = int4_tuning.config_from_label(label)
            sizes = {"M": rows, "N": n, "K": k, "M_BUCKET": 64}
            mix = _loop_mix(build_matmul_int4(config, SM90, sizes=sizes))
            out.append({"name": name, "kernel": "matmul_int4", "config": label} | mix)
    # One row, o sliding (1536 x 2048) as a plain product: the pinned `gemv_int4` against
    # the planar GEMV at the same block shape.
    from benchmarks.decode_residency import build_gemv_int4

    label = int4_tuning.pinned_tables()["NVIDIA H200"]["gemv_int4"]["1536,2048,0,0,32"]
    config = int4_tuning.config_from_label(label)
    mix = _loop_mix(build_gemv_int4(0, 0, False, config))
    out.append({"name": "o sliding, 1 row", "kernel": "gemv_int4", "config": label} | mix)
    block = {"BLOCK_N": config.kwargs["BLOCK_N"], "BLOCK_K": config.kwargs["BLOCK_K"]}
    gemv_signature = {k: v for k, v in signature.items() if k != "M"}
    source = ASTSource(
        fn=planar_gemv, signature=gemv_signature | dict.fromkeys(block, "constexpr"),
        constexprs=block, attrs={(i,): [["tt.divisibility", 16]] for i in range(6)},
    )  # fmt: skip
    built = triton.compile(source, target=SM90, options={"num_warps": config.num_warps})
    label = f"block_n={block['BLOCK_N']},block_k={block['BLOCK_K']},w={config.num_warps}"
    out.append({"name": "o sliding, 1 row", "kernel": "planar_gemv", "config": label}
               | _loop_mix(built))  # fmt: skip
    # The planar kernel's build does not depend on the shape (N and K are arguments).
    for vector in (0, 1):
        constants = {"BLOCK_M": 64, "BLOCK_N": 64, "SPLIT_K": 1, "CHUNKS": 1,
                     "SCALE_VECTOR": vector}  # fmt: skip
        source = ASTSource(
            fn=planar_int4, signature=signature | dict.fromkeys(constants, "constexpr"),
            constexprs=constants, attrs=aligned,
        )  # fmt: skip
        built = triton.compile(source, target=SM90, options={"num_warps": 4, "num_stages": 3})
        label = f"block_n=64,vector_scales={vector},w=4,s=3"
        out.append({"name": "every shape", "kernel": "planar", "config": label} | _loop_mix(built))
    return out


def _write(path: str | None, record: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(record, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.int4_planar_h200", description=__doc__)
    p.add_argument("--rows", default="64,1", help="row counts, comma-separated (1: the GEMV)")
    p.add_argument("--budget-s", type=float, default=230.0)
    p.add_argument("--out")
    p.add_argument("--dry-run", action="store_true", help="the arithmetic in Triton's interpreter")
    p.add_argument(
        "--sass", action="store_true", help="each kernel's main loop built for sm_90 (no GPU)"
    )
    args = p.parse_args(argv)
    if args.sass:
        mixes = sass_mix()
        print("| shape | kernel | config | loop | " + " | ".join(SASS_OPS) + " |")
        print("| --- " * (4 + len(SASS_OPS)) + "|")
        for m in mixes:
            cells = [m["name"], m["kernel"], f"`{m['config']}`", m["loop"]]
            print("| " + " | ".join(str(c) for c in cells + [m[op] for op in SASS_OPS]) + " |")
        _write(args.out, {"sass": mixes})
        return 0
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            p.error("--dry-run runs in Triton's interpreter: set TRITON_INTERPRET=1")
        checks = dry_run()
        for check in checks:
            print(f"config {check['config']}: max error / max {check['max_err_over_max']:.2e}")
        _write(args.out, {"dry_run": checks})
        return 0 if all(c["max_err_over_max"] < 2e-3 for c in checks) else 1
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA device (or --dry-run)")
    rows = [int(r) for r in args.rows.split(",") if r]
    results = measure(rows, args.budget_s)
    print(torch.cuda.get_device_name(), "weights streamed, groups of 32; planar config: "
          "(bn, bk, warps) at one row, else (bm, bn, split, chunks, vector scales, warps, "
          "stages)")  # fmt: skip
    print("| rows | shape | bf16 cuBLAS us | engine int4 us | planar us | planar config | "
          "planar error |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        planar = "n/a" if r["planar_us"] is None else f"{r['planar_us']:.1f}"
        print(f"| {r['rows']} | {r['name']} | {r['cublas_us']:.1f} | {r['shipped_us']:.1f} | "
              f"{planar} | {r['planar_config']} | {r['planar_err']} |")  # fmt: skip
    _write(args.out, {"gpu": torch.cuda.get_device_name(), "shapes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
