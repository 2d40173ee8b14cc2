"""Batch-1 projections of Gemma 4 E2B on one GPU: cuBLAS (`F.linear`) against the engine's
Triton matrix-vector kernel (`engines.pytorch.kernels.linear`), shape by shape and as the
whole chain of one decode step, against the copy bandwidth measured in the same run.

Each timing replays a CUDA graph of the products over enough distinct weight copies
(>= 256 MB) that the 50 MB L2 cache cannot serve them: the weights stream from HBM as
they do in a decode step.

    python -m benchmarks.gemv_h200 [--out result.json]

Prints a table; needs a CUDA device with Triton.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from engines.pytorch import kernels
from engines.pytorch.stepbench import copy_bandwidth

# (name, N, K, count per decode step) for random:gemma-4-e2b: 15 layers write K/V (12
# sliding, 3 full), 20 reuse them (16 sliding, 4 full) with double-wide MLPs.
SHAPES = (
    ("qkv sliding", 2048 + 512, 1536, 12),
    ("qkv full", 4096 + 1024, 1536, 3),
    ("q sliding (shared KV)", 2048, 1536, 16),
    ("q full (shared KV)", 4096, 1536, 4),
    ("o sliding", 1536, 2048, 28),
    ("o full", 1536, 4096, 7),
    ("gate_up", 2 * 6144, 1536, 15),
    ("gate_up double", 2 * 12288, 1536, 20),
    ("down", 1536, 6144, 15),
    ("down double", 1536, 12288, 20),
    ("ple gate", 256, 1536, 35),
    ("ple proj", 1536, 256, 35),
    ("ple model proj", 35 * 256, 1536, 1),
    ("lm head", 262_144, 1536, 1),
)
MIN_STREAM_BYTES = 256 << 20


def _timed_graph(fn: Callable[[], None], replays: int = 20) -> float:
    """Seconds per replay of a CUDA graph of `fn`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / replays)
    return sorted(times)[len(times) // 2]


def shape_times(n: int, k: int, dtype: torch.dtype) -> dict[str, Any]:
    nbytes = n * k * dtype.itemsize
    copies = max(1, math.ceil(MIN_STREAM_BYTES / nbytes))
    weights = [torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5 for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=dtype)
    out: dict[str, Any] = {"N": n, "K": k, "mbytes": nbytes / 1e6, "copies": copies}
    ref = F.linear(x, weights[0]).float()
    got = kernels.linear(x, weights[0]).float()
    out["max_abs_diff_vs_cublas"] = float((ref - got).abs().max())
    for name, op in (("cublas", F.linear), ("triton", kernels.linear)):
        seconds = _timed_graph(lambda op=op: [op(x, w) for w in weights]) / copies
        out[f"{name}_us"] = seconds * 1e6
        out[f"{name}_gb_s"] = nbytes / seconds / 1e9
    weights.clear()
    torch.cuda.empty_cache()
    return out


def _product(
    norm: bool,
    x: torch.Tensor,
    b: torch.Tensor,
    nw: torch.Tensor,
    w: torch.Tensor,
    fused: bool,
) -> torch.Tensor:
    if norm:
        return kernels.norm_linear(x, nw, 1e-6, w, fused)
    return kernels.gelu_mul_linear(x, b, w, fused)


def prologue_checks(dtype: torch.dtype) -> list[dict[str, Any]]:
    """The fused kernels against their unfused torch forms, on Gemma 4-like inputs:
    error relative to the output's scale, and time (one weight, L2-resident)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for name, n, k in (("norm + qkv", 2560, 1536), ("gelu gate + down", 1536, 6144)):
        w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
        x = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen) * 3
        b = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen)
        nw = torch.randn(k, device="cuda", dtype=dtype, generator=gen)
        fused = functools.partial(_product, name.startswith("norm"), x, b, nw, w)
        ref, got = fused(False).float(), fused(True).float()
        out.append(
            {
                "name": name,
                "max_abs_err_over_max_abs": float((ref - got).abs().max() / ref.abs().max()),
                "unfused_us": 1e6 * _timed_graph(lambda fn=fused: fn(False)),
                "fused_us": 1e6 * _timed_graph(lambda fn=fused: fn(True)),
            }
        )
    for name, n, k, norm in (
        ("residual + norm + gate_up", 12288, 1536, True),
        ("residual x scalar + ple gate", 256, 1536, False),
    ):
        w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k**0.5
        x = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen) * 3
        branch = torch.randn(1, k, device="cuda", dtype=dtype, generator=gen)
        bw = torch.randn(k, device="cuda", dtype=dtype, generator=gen)
        nw = torch.randn(k, device="cuda", dtype=dtype, generator=gen) if norm else None
        scalar = None if norm else torch.full((1,), 0.7, device="cuda", dtype=dtype)
        step = functools.partial(kernels.residual_linear, x, branch, bw, scalar, nw, 1e-6, w)
        (ref, ref_x), (got, got_x) = step(False), step(True)
        err = float((ref.float() - got.float()).abs().max() / ref.float().abs().max())
        out.append(
            {
                "name": name,
                "max_abs_err_over_max_abs": err,
                "residual_row_equal": bool(torch.equal(ref_x, got_x)),
                "unfused_us": 1e6 * _timed_graph(lambda st=step: st(False)),
                "fused_us": 1e6 * _timed_graph(lambda st=step: st(True)),
            }
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gemv_h200", description=__doc__)
    p.add_argument("--out")
    args = p.parse_args(argv)
    dtype = torch.bfloat16
    bw = copy_bandwidth(torch.device("cuda"), nbytes=1 << 30)
    rows = []
    for name, n, k, count in SHAPES:
        r = shape_times(n, k, dtype)
        r.update(name=name, count=count)
        rows.append(r)
    step_bytes = sum(r["mbytes"] * 1e6 * r["count"] for r in rows)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bandwidth_gb_s": bw / 1e9,
        "shapes": rows,
        "step_weight_gb": step_bytes / 1e9,
        "step_roofline_ms": 1e3 * step_bytes / bw,
    }
    for impl in ("cublas", "triton"):
        result[f"step_{impl}_ms"] = sum(r[f"{impl}_us"] * r["count"] for r in rows) / 1e3
    result["step_best_ms"] = (
        sum(min(r["cublas_us"], r["triton_us"]) * r["count"] for r in rows) / 1e3
    )
    lines = [
        f"{result['gpu']}, copy bandwidth {bw / 1e9:.0f} GB/s",
        "| projection | N x K | MB | x/step | cuBLAS us (GB/s) | Triton us (GB/s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['N']} x {r['K']} | {r['mbytes']:.1f} | {r['count']} | "
            f"{r['cublas_us']:.1f} ({r['cublas_gb_s']:.0f}) | "
            f"{r['triton_us']:.1f} ({r['triton_gb_s']:.0f}) |"
        )
    lines.append(
        f"| one step's projections | | {step_bytes / 1e6:.0f} | | "
        f"{result['step_cublas_ms']:.3f} ms | {result['step_triton_ms']:.3f} ms |"
    )
    lines.append(
        f"roofline {result['step_roofline_ms']:.3f} ms; best of both per shape "
        f"{result['step_best_ms']:.3f} ms"
    )
    result["prologues"] = prologue_checks(dtype)
    for c in result["prologues"]:
        lines.append(
            f"{c['name']}: fused {c['fused_us']:.1f} us vs unfused {c['unfused_us']:.1f} us, "
            f"max error {c['max_abs_err_over_max_abs']:.2e} of the output's scale"
            + (
                f", residual row bit-equal: {c['residual_row_equal']}"
                if "residual_row_equal" in c
                else ""
            )
        )
    result["table"] = "\n".join(lines)
    print(result["table"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
