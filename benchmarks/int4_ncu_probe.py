"""One projection shape's int4 product beside bf16 cuBLAS, each launched a few times in
turn, for Nsight Compute to read (`bash benchmarks/int4_h200.sh ncu`): the engine's
`kernels.linear` on a W4A16 weight (groups of 32, the pinned table's configuration) and
`F.linear` on the same weight in bf16, at the rows given. Three rounds warm both up
(the autotuner, cuBLAS's heuristics), then six rounds run for the profiler to pick from.
With --cuda-config, the int4 side is `cuda_int4_rows`' product at that configuration
(a name as its table writes it, e.g. w8_rw1_sk1_st2) instead, compiled by NVRTC for
the GPU as the engine compiles its builds.

    python -m benchmarks.int4_ncu_probe N K ROWS [--cuda-config NAME]

Prints the configuration the int4 kernel ran; needs a CUDA device with Triton.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engines.pytorch import cuda_int4_rows, int4, kernels

GROUP = 32
WARM_ROUNDS, PROFILED_ROUNDS = 3, 6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.int4_ncu_probe", description=__doc__)
    p.add_argument("n", type=int, help="outputs")
    p.add_argument("k", type=int, help="inputs (whole groups of 32)")
    p.add_argument("rows", type=int)
    p.add_argument("--cuda-config", help="cuda_int4_rows' configuration to run instead")
    args = p.parse_args(argv)
    build = None
    if args.cuda_config:
        try:
            config = cuda_int4_rows.Config.parse(args.cuda_config)
        except ValueError as exc:
            p.error(f"--cuda-config: {exc}")
        build = cuda_int4_rows.Build(args.n, args.k, cuda_int4_rows.tiles_for(args.rows), config)
        if not cuda_int4_rows.fits(build):
            p.error(f"--cuda-config: the source does not take {args.cuda_config} at this shape")
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    if args.k % GROUP:
        p.error(f"inputs must be whole groups of {GROUP}: {args.k}")
    torch.manual_seed(0)
    weight = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16) / args.k**0.5
    quantized = int4.quantize(weight, GROUP)
    x = torch.randn(args.rows, args.k, device="cuda", dtype=torch.bfloat16)
    product: Callable[[], object] = functools.partial(kernels.linear, x, quantized)
    if build is not None:
        rows_product = cuda_int4_rows.loaded_product(x.device, build)
        if rows_product is None:
            p.error(f"--cuda-config: {args.cuda_config} does not build on this GPU")
        product = functools.partial(rows_product, x, *quantized)
    for _ in range(WARM_ROUNDS + PROFILED_ROUNDS):
        product()
        F.linear(x, weight)
    torch.cuda.synchronize()
    print("int4 configurations:", args.cuda_config or kernels.tuned_configs())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
