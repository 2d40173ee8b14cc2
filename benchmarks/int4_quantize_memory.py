"""The memory `--quantize w4a16` takes beyond the weight it quantizes: `int4.quantize` and
`int4.dequantize` of one large weight, by rows (`int4.CHUNK_VALUES`, as shipped) against
the whole weight in one pass (the same functions with the chunk past the weight's size),
side by side in one run (issue 18).

The default shape is E2B's largest table, its per-layer embeddings (262,144 x 8,960, 4.7
GB in bf16): on CUDA the figure is the allocator's peak above what the weight itself
holds; on the CPU each variant runs in its own process and the figure is its peak
resident memory above the weight's (`--rows` makes the table smaller for a small host).

    python -m benchmarks.int4_quantize_memory [--rows 262144] [--cols 8960] [--device cuda]

Prints a table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VARIANTS = ("by rows (shipped)", "whole weight")


def one(variant: str, rows: int, cols: int, device: str) -> dict[str, float]:
    """Quantize and dequantize a (rows, cols) bf16 weight; the peaks above the weight."""
    import torch

    from engines.pytorch import int4

    if variant == "whole weight":
        int4.CHUNK_VALUES = rows * cols
    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(rows, cols, generator=gen, device=device, dtype=torch.bfloat16)
    weight_gb = weight.numel() * weight.element_size() / 1e9
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    packed, scale = int4.quantize(weight, 32)
    if device == "cuda":
        torch.cuda.synchronize()
        quantize_peak = torch.cuda.max_memory_allocated() - base
        torch.cuda.reset_peak_memory_stats()
    quantize_s = time.perf_counter() - start
    start = time.perf_counter()
    # Dequantized one way only (no second dense copy of the weight kept): the CPU path's
    # load, whose output replaces the weight.
    del weight
    dense = int4.dequantize(packed, scale, torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
        dequantize_peak = torch.cuda.max_memory_allocated() - base
        out = {
            "quantize_extra_gb": quantize_peak / 1e9,
            "dequantize_extra_gb": dequantize_peak / 1e9,
        }
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base_rss
        out = {"peak_extra_gb": peak / 1e9}
    del dense
    return out | {
        "weight_gb": weight_gb,
        "quantize_s": quantize_s,
        "dequantize_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.int4_quantize_memory", description=__doc__
    )
    p.add_argument("--rows", type=int, default=262_144)
    p.add_argument("--cols", type=int, default=8_960)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:  # a CPU variant's own process
        print(json.dumps(one(args.variant, args.rows, args.cols, args.device)))
        return 0
    results = {}
    for variant in VARIANTS:
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                p.error("no CUDA device: pass --device cpu")
            try:
                results[variant] = one(variant, args.rows, args.cols, "cuda")
            except torch.cuda.OutOfMemoryError:
                print(f"{variant}: out of GPU memory")
            torch.cuda.empty_cache()
        else:
            cmd = [
                sys.executable, "-m", "benchmarks.int4_quantize_memory", "--variant", variant,
                "--rows", str(args.rows), "--cols", str(args.cols), "--device", "cpu",
            ]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
            if done.returncode:
                print(f"{variant}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
                continue
            results[variant] = json.loads(done.stdout)
    print(f"{args.rows} x {args.cols} bf16 on {args.device}, groups of 32")
    print("| variant | weight GB | memory above the weight GB | quantize s | dequantize s |")
    print("| --- | --- | --- | --- | --- |")
    for variant, r in results.items():
        extra = (
            f"quantize {r['quantize_extra_gb']:.2f}, dequantize {r['dequantize_extra_gb']:.2f}"
            if "quantize_extra_gb" in r
            else f"{r['peak_extra_gb']:.2f} (peak resident)"
        )
        print(f"| {variant} | {r['weight_gb']:.2f} | {extra} | {r['quantize_s']:.2f} | "
              f"{r['dequantize_s']:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
