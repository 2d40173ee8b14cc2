"""A planar int4 layout at 64 rows against the engine's `matmul_int4` and bf16 cuBLAS
(issue 18; records: `benchmarks/records/2026-12-05-h100-matmul-int4-64-rows.md`).

The engine keeps compressed-tensors' layout: nibble i of word j is input 8j + i, so
`matmul_int4` interleaves the eight dequantized nibble tiles back into input order
before `tl.dot`, and that tile reaches the tensor cores through shared memory (stores,
barriers, `ldmatrix`). Here word j of each 128-input chunk holds inputs j, 16 + j, ...,
112 + j instead: nibble tile i is the 16 inputs from 16 i, one dot of its own, no
interleave, and Triton loads the words straight into the dot's register layout (built for
sm_90: no shared-memory round trip, 2 barriers a chunk against 9). Split-K adds into a
float32 output with atomics (a timing stand-in for the engine's ordered fix-up).

Each shape's weights stream from DRAM (copies past 256 MB, CUDA graphs, as
`benchmarks.int4_h200`); the planar kernel's block shapes are searched within BUDGET_S.

    python -m benchmarks.int4_planar_h200 [--rows 64] [--budget-s 230] [--out planar.json]
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
import triton.language as tl

from engines.pytorch.triton_int4 import PAIR_FORMS, _dequantized
from engines.pytorch.triton_kernels import COMPILED

CHUNK = 128  # inputs a planar chunk: 16 words of 8 nibbles
SHAPES = (
    ("qkv sliding", 2560, 1536),
    ("o sliding", 1536, 2048),
    ("gate_up", 12288, 1536),
    ("gate_up double", 24576, 1536),
    ("down", 1536, 6144),
    ("down double", 1536, 12288),
)


def _planar_pairs_asm(base: int, one: int, minus_offset: int, fma: str) -> str:
    # `triton_int4._pairs_asm` with a scale a group: nibbles (i, i + 4) of a planar word
    # are inputs 16 i + j and 16 (i + 4) + j, of groups i // 2 and i // 2 + 2, so the
    # pair is scaled by {$9, $11} (i = 0, 1) or {$10, $12} (i = 2, 3).
    pairs = "".join(
        f"shr.u32 t, $8, {4 * i}; lop3.b32 t, t, 0x000F000F, {base:#x}, 0xEA; "
        f"{fma} t, t, one, off; {fma} t, t, {'s02' if i < 2 else 's13'}, zero; "
        f"mov.b32 {{${i}, ${i + 4}}}, t; "
        for i in range(4)
    )
    constants = f"mov.b32 one, {one:#x}; mov.b32 off, {minus_offset:#x}; mov.b32 zero, 0x80008000; "
    scales = "mov.b32 s02, {$9, $11}; mov.b32 s13, {$10, $12}; "
    return "{ .reg .b32 t, s02, s13, one, off, zero; " + scales + constants + pairs + "}"


PLANAR_PAIRS_BF16 = tl.constexpr(_planar_pairs_asm(*PAIR_FORMS["bfloat16"]))
PLANAR_PAIRS_FP16 = tl.constexpr(_planar_pairs_asm(*PAIR_FORMS["float16"]))


@triton.jit
def _group_tiles(
    wq_ptr, ws_ptr, outs, k0, K, BLOCK_N: tl.constexpr, SCALE_VECTOR: tl.constexpr,
    dtype: tl.constexpr,
):  # fmt: skip
    # A chunk's eight nibble tiles (outputs, 16): tiles 2g and 2g + 1 are group g's
    # (groups of 32), each scaled by its group's scale.
    j = tl.arange(0, 16)
    packed = tl.load(wq_ptr + outs[:, None] * (K // 8) + (k0 // 8 + j)[None, :])
    scales = ws_ptr + outs * (K // 32) + k0 // 32
    if SCALE_VECTOR:
        # The chunk's four scales of each output in one 8-byte load (Triton's pipeliner
        # copies loads of 4 bytes and more ahead; 2-byte ones stay synchronous).
        even, odd = tl.split(tl.reshape(
            tl.load(scales[:, None] + tl.arange(0, 4)[None, :]), (BLOCK_N, 2, 2)
        ))  # fmt: skip
        g0, g2 = tl.split(even)
        g1, g3 = tl.split(odd)
    else:
        g0 = tl.load(scales)
        g1 = tl.load(scales + 1)
        g2 = tl.load(scales + 2)
        g3 = tl.load(scales + 3)
    s0 = tl.broadcast_to(g0[:, None], (BLOCK_N, 16))
    s1 = tl.broadcast_to(g1[:, None], (BLOCK_N, 16))
    s2 = tl.broadcast_to(g2[:, None], (BLOCK_N, 16))
    s3 = tl.broadcast_to(g3[:, None], (BLOCK_N, 16))
    if COMPILED:
        return tl.inline_asm_elementwise(
            PLANAR_PAIRS_BF16 if s0.dtype == tl.bfloat16 else PLANAR_PAIRS_FP16,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,h,h", [packed, s0, s1, s2, s3], dtype=(s0.dtype,) * 8,
            is_pure=True, pack=1,
        )  # fmt: skip
    return (
        _dequantized(packed, s0.to(tl.float32), 0, dtype),
        _dequantized(packed, s0.to(tl.float32), 1, dtype),
        _dequantized(packed, s1.to(tl.float32), 2, dtype),
        _dequantized(packed, s1.to(tl.float32), 3, dtype),
        _dequantized(packed, s2.to(tl.float32), 4, dtype),
        _dequantized(packed, s2.to(tl.float32), 5, dtype),
        _dequantized(packed, s3.to(tl.float32), 6, dtype),
        _dequantized(packed, s3.to(tl.float32), 7, dtype),
    )


@triton.jit
def _tile_dot(acc, w, x_ptr, rows, row_ok, k0, K, i: tl.constexpr):
    cols = k0 + 16 * i + tl.arange(0, 16)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None], other=0.0)
    return acc + tl.dot(w, tl.trans(x))


@triton.jit
def planar_int4(
    x_ptr, wq_ptr, ws_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, CHUNKS: tl.constexpr, SCALE_VECTOR: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    STEP: tl.constexpr = 128 * CHUNKS * SPLIT_K
    dtype = x_ptr.dtype.element_ty
    for k1 in range(tl.program_id(2) * 128 * CHUNKS, K, STEP):
        for c in tl.static_range(CHUNKS):
            k0 = k1 + 128 * c
            w0, w1, w2, w3, w4, w5, w6, w7 = _group_tiles(
                wq_ptr, ws_ptr, outs, k0, K, BLOCK_N, SCALE_VECTOR, dtype
            )
            acc = _tile_dot(acc, w0, x_ptr, rows, row_ok, k0, K, 0)
            acc = _tile_dot(acc, w1, x_ptr, rows, row_ok, k0, K, 1)
            acc = _tile_dot(acc, w2, x_ptr, rows, row_ok, k0, K, 2)
            acc = _tile_dot(acc, w3, x_ptr, rows, row_ok, k0, K, 3)
            acc = _tile_dot(acc, w4, x_ptr, rows, row_ok, k0, K, 4)
            acc = _tile_dot(acc, w5, x_ptr, rows, row_ok, k0, K, 5)
            acc = _tile_dot(acc, w6, x_ptr, rows, row_ok, k0, K, 6)
            acc = _tile_dot(acc, w7, x_ptr, rows, row_ok, k0, K, 7)
    offsets = outs[:, None] + rows[None, :] * N
    if SPLIT_K == 1:
        tl.store(y_ptr + offsets, acc.to(y_ptr.dtype.element_ty), mask=row_ok[None, :])
    else:
        tl.atomic_add(y_ptr + offsets, acc, mask=row_ok[None, :], sem="relaxed")


def planar_pack(q: Any) -> Any:
    """(N, K) int4 values in [-8, 7] -> (N, K / 8) int32 words, planar per 128 inputs."""
    import torch

    n, k = q.shape
    u = (q.to(torch.int32) + 8).reshape(n, k // CHUNK, 8, 16)
    words = torch.zeros(n, k // CHUNK, 16, dtype=torch.int32, device=q.device)
    for i in range(8):
        words |= u[:, :, i, :] << (4 * i)
    return words.reshape(n, k // 8)


def run_planar(x: Any, words: Any, scale: Any, config: tuple, out: Any = None) -> Any:
    """x @ w^T; config (BLOCK_M, BLOCK_N, SPLIT_K, CHUNKS, SCALE_VECTOR, warps, stages).
    With a split, `out` (float32) is zeroed and summed into."""
    import torch

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
    n, k, m = 64, 512, 5
    packed, scale = int4.quantize((torch.randn(n, k) / k**0.5).to(torch.float16), 32)
    words = planar_pack(int4.unpack(packed, k))
    x = torch.randn(m, k, dtype=torch.float16)
    ref = x.float() @ int4.dequantize(packed, scale, torch.float32).T
    out = []
    for config in ((64, 64, 1, 1, 0, 4, 1), (64, 64, 2, 1, 1, 4, 1), (64, 32, 2, 2, 1, 4, 1)):
        got = run_planar(x, words, scale, config).float()
        err = float((got - ref).abs().max() / ref.abs().max())
        out.append({"config": list(config), "max_err_over_max": err})
    return out


def _shape_times(name: str, n: int, k: int, rows: int, seconds_left: float) -> dict[str, Any]:
    """One shape: cuBLAS, the engine's kernel, and the planar kernel's best block shape
    found within `seconds_left`."""
    import torch
    import torch.nn.functional as F

    from benchmarks.gemv_h200 import _timed_graph
    from engines.pytorch import int4, kernels

    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    packed, scale = int4.quantize(w, 32)
    words = planar_pack(int4.unpack(packed, k))
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ kernels.dense((packed, scale), torch.float32).T
    copies = max(1, math.ceil((256 << 20) / (n * k // 2 + n * k // 16)))
    ours = [(packed.clone(), scale.clone()) for _ in range(copies)]
    r: dict[str, Any] = {"name": name, "N": n, "K": k, "rows": rows}
    r["shipped_us"] = 1e6 * _timed_graph(lambda: [kernels.linear(x, o) for o in ours]) / copies
    ours.clear()
    dense = [w.clone() for _ in range(max(1, math.ceil((256 << 20) / (n * k * 2))))]
    r["cublas_us"] = 1e6 * _timed_graph(lambda: [F.linear(x, d) for d in dense]) / len(dense)
    dense.clear()
    planar = [(words.clone(), scale.clone()) for _ in range(copies)]
    best: tuple | None = None
    deadline = time.monotonic() + seconds_left
    splits = (1,) if n >= 8192 else (2, 4, 8)
    for chunks, stages, (block_n, warps), split, vector in itertools.product(
        (1, 2), (3, 4), ((64, 4), (128, 8)), splits, (0, 1)
    ):
        if time.monotonic() > deadline:
            break
        if (k // CHUNK) % (split * chunks):
            continue
        config = (64, block_n, split, chunks, vector, warps, stages)
        got = run_planar(x, words, scale, config).float()
        err = float((got - ref).abs().max() / ref.abs().max())
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


def measure(rows: int, budget_s: float) -> list[dict[str, Any]]:
    return [_shape_times(name, n, k, rows, budget_s / len(SHAPES)) for name, n, k in SHAPES]


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
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--budget-s", type=float, default=230.0)
    p.add_argument("--out")
    p.add_argument("--dry-run", action="store_true", help="the arithmetic in Triton's interpreter")
    p.add_argument(
        "--sass", action="store_true", help="each kernel's main loop built for sm_90 (no GPU)"
    )
    args = p.parse_args(argv)
    if args.sass:
        mixes = sass_mix(args.rows)
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
    results = measure(args.rows, args.budget_s)
    print(torch.cuda.get_device_name(), f"{args.rows} rows, weights streamed, groups of 32")
    print("| shape | bf16 cuBLAS us | matmul_int4 us | planar us | planar (bm, bn, split, "
          "chunks, vector scales, warps, stages) | planar error |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        planar = "n/a" if r["planar_us"] is None else f"{r['planar_us']:.1f}"
        print(f"| {r['name']} | {r['cublas_us']:.1f} | {r['shipped_us']:.1f} | {planar} | "
              f"{r['planar_config']} | {r['planar_err']} |")  # fmt: skip
    _write(args.out, {"gpu": torch.cuda.get_device_name(), "shapes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
