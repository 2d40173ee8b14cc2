"""Gemma 4 E2B's projections on one GPU in three weight forms, shape by shape and as one
decode step's chain, at 1, 8 and 64 rows: bf16 through cuBLAS (`F.linear`), W4A16 through
the engine's int4 kernels (`engines.pytorch.kernels.linear`: `gemv_int4` at one row,
`matmul_int4` for a few), and W4A16 through torch's own `aten._weight_int4pack_mm`
(tinygemm), all with groups of 32; against the copy bandwidth measured in the same run.
First, the int4 kernels' results against dequantize-then-matmul on the GPU (each shape,
and the fused forms the decode program uses).

Timings replay a CUDA graph of the products over enough weight copies (>= 256 MB) that
the L2 cache cannot serve them (`benchmarks.gemv_h200`). With `--l2-resident` the graph
launches as many products, all over one copy, which the L2 cache then serves (where it
fits: an int4 weight up to about 40 MB): where a shape's time stays the same, its
products are bound by something other than DRAM (launch, latency, instructions).

    python -m benchmarks.int4_h200 [--out result.json] [--batches 1,8,64] [--l2-resident]
        [--int4-configs table.json]
    python -m benchmarks.int4_h200 --dequantize   # the prefill's dense weights, two ways
    python -m benchmarks.int4_h200 --batches 512,2048   # a prefill's rows

At more rows than `matmul_int4` takes (a prefill's), the engine's int4 path is its
weight made dense and cuBLAS (`kernels.linear`); `matmul_int4` over those rows is timed
beside it (`int4 matmul rows`), the weights dequantized in registers tile by tile, which
would spare a prefill the dense copy's writes and reads. The LM head is left out there:
a prefill's logits are its last rows'.

Prints a table; needs a CUDA device with Triton.
"""

from __future__ import annotations

import argparse
import json
import math
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gemv_h200 import MIN_STREAM_BYTES, SHAPES, _timed_graph
from engines.pytorch import int4, int4_tuning, kernels
from engines.pytorch.stepbench import copy_bandwidth

GROUP = 32
# What each shape is timed through: cuBLAS on bf16, the engine's int4 path, torch's
# tinygemm, and `matmul_int4` past the rows the engine gives it (a prefill's).
IMPLS = ("bf16_cublas", "int4_ours", "int4_torch", "int4_matmul_rows")


def _tinygemm(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's int4 layout for `_weight_int4pack_mm`: values 0..15 two to a byte, packed
    by `_convert_weight_to_int4pack`, and (groups, N, 2) scales and zero points."""
    k = w.shape[1]
    packed, scale = int4.quantize(w, GROUP)
    q = (int4.unpack(packed, k).to(torch.int32) + 8).to(torch.uint8)
    pairs = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()
    tiles = torch._convert_weight_to_int4pack(pairs, 8)
    # tinygemm: w = (q - 8) * scale + zero with zero = 0 for a symmetric grid.
    zeros = torch.zeros_like(scale)
    sz = torch.stack([scale, zeros], dim=-1).transpose(0, 1).contiguous()
    return tiles, sz


def correctness() -> list[dict[str, Any]]:
    """Relative max error of the int4 kernels against x @ dequantize(w)^T in float32."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = []
    dtype = torch.bfloat16
    for name, n, k, _count in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
        q = int4.quantize(w, GROUP)
        wf = kernels.dense(q, torch.float32)
        for rows in (1, 8, 64):
            x = torch.randn(rows, k, device="cuda", dtype=dtype, generator=gen)
            ref = x.float() @ wf.T
            got = kernels.linear(x, q)
            err = float((got.float() - ref).abs().max() / ref.abs().max())
            # Split-K sums in a fixed order: the same bits on every launch.
            repeats_equal = all(torch.equal(kernels.linear(x, q), got) for _ in range(3))
            check = {"name": name, "rows": rows, "max_err_over_max": err}
            out.append(check | {"repeats_equal": repeats_equal})
    n, k = 2 * 6144, 1536
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
    q = int4.quantize(w, GROUP)
    x = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen) * 3
    nw = torch.randn(k, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen)
    m = torch.randn(1, n, device="cuda", dtype=dtype, generator=gen)
    forms: dict[str, Callable[[bool], torch.Tensor]] = {
        "norm + gate/up pair (post scale)": lambda f: kernels.gated_norm_linear(
            x, nw, 1e-6, q, f, post_scale=True
        ),
        "norm + linear": lambda f: kernels.norm_linear(x, nw, 1e-6, q, f),
        "residual + linear, gelu times": lambda f: kernels.residual_linear(
            x, b, nw, None, None, 1e-6, q, f, gate_times=m
        )[0],
    }
    for name, fn in forms.items():
        ref, got = fn(False).float(), fn(True).float()
        err = float((got - ref).abs().max() / ref.abs().max())
        repeats_equal = all(torch.equal(fn(True).float(), got) for _ in range(3))
        out.append(
            {"name": name, "rows": 1, "max_err_over_max": err, "repeats_equal": repeats_equal}
        )
    # Every split-K tile's last program reset its counter for the next launch.
    counters = kernels._split_counters(torch.device("cuda", torch.cuda.current_device()))
    out.append({"name": "split-K counters all reset", "ok": int(counters.count_nonzero()) == 0})
    return out


def _copies(make: Callable[[], Any], count: int, l2_resident: bool) -> list[Any]:
    """`count` weights to launch over: distinct copies, or one copy `count` times."""
    if l2_resident:
        return [make()] * count
    return [make() for _ in range(count)]


def shape_times(n: int, k: int, rows: int, l2_resident: bool = False) -> dict[str, Any]:
    dtype = torch.bfloat16
    dense_bytes = n * k * 2
    int4_bytes = n * k // 2 + n * (k // GROUP) * 2
    copies = max(1, math.ceil(MIN_STREAM_BYTES / int4_bytes))
    x = torch.randn(rows, k, device="cuda", dtype=dtype)
    out: dict[str, Any] = {"N": n, "K": k, "rows": rows, "copies": copies}
    base = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
    packed, scale = int4.quantize(base, GROUP)
    ours = _copies(lambda: (packed.clone(), scale.clone()), copies, l2_resident)
    dense_copies = max(1, math.ceil(MIN_STREAM_BYTES / dense_bytes))
    dense = _copies(base.clone, dense_copies, l2_resident)
    impls: list[tuple[str, Callable[[], Any], int, int]] = [
        ("bf16_cublas", lambda: [F.linear(x, w) for w in dense], dense_copies, dense_bytes),
        ("int4_ours", lambda: [kernels.linear(x, w) for w in ours], copies, int4_bytes),
    ]
    if rows > kernels.INT4_MATMUL_MAX_ROWS:
        matmul_rows = lambda: [kernels._launch_matmul_int4(x, *w) for w in ours]  # noqa: E731
        impls.append(("int4_matmul_rows", matmul_rows, copies, int4_bytes))
    try:
        tiles, sz = _tinygemm(base)
        torch_int4 = _copies(lambda: (tiles.clone(), sz.clone()), copies, l2_resident)
        impls.append(
            (
                "int4_torch",
                lambda: [torch._weight_int4pack_mm(x, t, GROUP, s) for t, s in torch_int4],
                copies,
                int4_bytes,
            )
        )
    except Exception as exc:  # recorded: torch's layout may refuse a shape
        out["int4_torch_error"] = f"{type(exc).__name__}: {exc}"
    for name, fn, count, nbytes in impls:
        try:
            seconds = _timed_graph(fn) / count
        except Exception as exc:
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            continue
        out[f"{name}_us"] = seconds * 1e6
        out[f"{name}_gb_s"] = nbytes / seconds / 1e9
    dense.clear()
    ours.clear()
    torch.cuda.empty_cache()
    return out


def dequantize_times() -> dict[str, Any]:
    """One decode step's weights made dense (what a prefill of more rows than
    `matmul_int4` takes multiplies): the CUDA kernel `kernels.dense` runs against the
    torch form (`int4.dequantize`, which the CPU runs), ms for one step's 212 weights
    (q/k/v and gate/up merged)."""
    dtype = torch.bfloat16
    out: dict[str, Any] = {}
    for form, fn in (
        ("triton_kernel", lambda q: kernels.dense(q, dtype)),
        ("torch_ops", lambda q: int4.dequantize(q[0], q[1], dtype)),
    ):
        total = 0.0
        for name, n, k, count in SHAPES:
            q = int4.quantize(torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5, GROUP)
            fn(q)
            # Several launches queued before timing: the device's time, not the host's.
            torch.cuda.synchronize()
            torch.cuda._sleep(20_000_000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                fn(q)
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 5
            total += ms * count
            if name == "lm head":
                out[f"{form}_lm_head_gb_s"] = (n * k * 2 + n * k // 2) / ms / 1e6
        out[f"{form}_ms"] = total
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.int4_h200", description=__doc__)
    p.add_argument("--out")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument(
        "--dequantize", action="store_true", help="only time making one step's weights dense"
    )
    p.add_argument(
        "--l2-resident",
        action="store_true",
        help="launch each shape's products over one weight copy (L2 serves it where it fits)",
    )
    p.add_argument(
        "--int4-configs", type=Path, help="a pinned table for the int4 kernels (the engine's flag)"
    )
    args = p.parse_args(argv)
    if args.int4_configs:
        try:
            int4_tuning.use_pinned_tables(args.int4_configs)
        except int4_tuning.PinnedTableError as exc:
            p.error(str(exc))
    if args.dequantize:
        times = dequantize_times()
        print(
            f"one step's weights made dense (bf16, {GROUP}-groups): "
            + ", ".join(f"{name} {value:.2f}" for name, value in times.items())
        )
        return times
    batches = [int(b) for b in args.batches.split(",") if b]
    bw = copy_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bandwidth_gb_s": bw / 1e9,
        "group_size": GROUP,
        "l2_resident": args.l2_resident,
    }
    try:
        result["correctness"] = correctness()
    except Exception:
        result["correctness_error"] = traceback.format_exc()
    rows_out = []
    for rows in batches:
        for name, n, k, count in SHAPES:
            if rows > kernels.INT4_MATMUL_MAX_ROWS and name == "lm head":
                continue
            r = shape_times(n, k, rows, args.l2_resident)
            r.update(name=name, count=count)
            rows_out.append(r)
    result["shapes"] = rows_out
    result["tuned_configs"] = kernels.tuned_configs()
    dense_gb = sum(n * k * 2 * c for _, n, k, c in SHAPES) / 1e9
    int4_gb = sum((n * k // 2 + n * (k // GROUP) * 2) * c for _, n, k, c in SHAPES) / 1e9
    result["step_weight_gb"] = {"bf16": dense_gb, "int4": int4_gb}
    result["step_roofline_ms"] = {
        "bf16": 1e3 * dense_gb * 1e9 / bw,
        "int4": 1e3 * int4_gb * 1e9 / bw,
    }
    lines = [
        f"{result['gpu']}, copy bandwidth {bw / 1e9:.0f} GB/s, int4 groups of {GROUP}"
        + (", each shape's weights L2-resident where they fit" if args.l2_resident else ""),
        f"one step's projections: bf16 {dense_gb:.2f} GB (roofline "
        f"{result['step_roofline_ms']['bf16']:.3f} ms), int4 {int4_gb:.2f} GB (roofline "
        f"{result['step_roofline_ms']['int4']:.3f} ms)",
        "| rows | bf16 cuBLAS ms | int4 ours ms | int4 torch tinygemm ms | ours vs bf16 | "
        "ours vs tinygemm | int4 matmul rows ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    steps: dict[str, dict[str, float]] = {}
    for rows in batches:
        these = [r for r in rows_out if r["rows"] == rows]
        step = {}
        for impl in IMPLS:
            if these and all(f"{impl}_us" in r for r in these):
                step[impl] = sum(r[f"{impl}_us"] * r["count"] for r in these) / 1e3
        steps[str(rows)] = step
        b, o, t = (step.get(i) for i in ("bf16_cublas", "int4_ours", "int4_torch"))
        lines.append(
            f"| {rows} | {b or float('nan'):.3f} | {o or float('nan'):.3f} | "
            f"{t or float('nan'):.3f} | {(o / b) if b and o else float('nan'):.2f}x time | "
            f"{(t / o) if t and o else float('nan'):.2f}x faster | "
            f"{step.get('int4_matmul_rows', float('nan')):.3f} |"
        )
    result["step_ms"] = steps
    lines.append(
        "| projection | rows | bf16 us (GB/s) | int4 ours us (GB/s) | tinygemm us (GB/s) | "
        "int4 matmul rows us (GB/s) |"
    )
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for r in rows_out:
        cells = [
            f"{r[f'{i}_us']:.1f} ({r[f'{i}_gb_s']:.0f})" if f"{i}_us" in r else "-" for i in IMPLS
        ]
        lines.append(f"| {r['name']} {r['N']}x{r['K']} | {r['rows']} | " + " | ".join(cells) + " |")
    checks = result.get("correctness", [])
    worst = max((c["max_err_over_max"] for c in checks if "max_err_over_max" in c), default=None)
    lines.append(f"int4 kernels vs dequantize-then-matmul: worst max error {worst} of the scale")
    unequal = [c["name"] for c in checks if c.get("repeats_equal") is False or c.get("ok") is False]
    lines.append(f"repeat launches bit-equal, counters reset: {unequal or 'yes'}")
    result["table"] = "\n".join(lines)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(result["table"])
    return result


if __name__ == "__main__":
    main()
