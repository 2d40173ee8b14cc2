"""The floor of a launch boundary on one GPU: launches of kernels that do nothing but a
dependent launch's two instructions (`griddepcontrol.launch_dependents`, `.wait`), at the
grids of `stage_chain_h200`'s chain of E2B's products (35 layers x 6, tiles of 8
outputs), replayed in a CUDA graph; with and without dependent launch, one program a
launch, and each program loading and storing one word. What a product chain takes beyond
this floor is the products' own serial path, not their boundaries.

    python -m benchmarks.boundary_floor_h200 [--out result.json]

Prints a table; needs a CUDA device with Triton (dependent launch: compute capability 9+).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from benchmarks.stage_chain_h200 import LAYER

LAYERS, BLOCK_N = 35, 8


@triton.jit
def boundary(x_ptr, PDL: tl.constexpr, TOUCH: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if TOUCH:  # one word a program, read and written after the wait
        i = tl.program_id(0)
        tl.store(x_ptr + i, tl.load(x_ptr + i) + 1)


def variants(x: torch.Tensor, pdl_capable: bool) -> dict[str, Callable[[], None]]:
    """Each variant's launches, one a product of the chain."""
    grids = [triton.cdiv(n, BLOCK_N) for _ in range(LAYERS) for _name, n, _k in LAYER]

    def launches(pdl: bool, touch: bool, one: bool) -> Callable[[], None]:
        def run() -> None:
            for grid in grids:
                boundary[(1 if one else grid,)](
                    x, PDL=pdl, TOUCH=touch, num_warps=4, launch_pdl=pdl
                )

        return run

    table = {}
    for pdl in (True, False) if pdl_capable else (False,):
        label = "PDL" if pdl else "no PDL"
        table[f"empty, {label}, chain grids"] = launches(pdl, False, False)
        table[f"empty, {label}, one program"] = launches(pdl, False, True)
        table[f"a word a program, {label}, chain grids"] = launches(pdl, True, False)
    return table


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gemv_h200 import _timed_graph

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    x = torch.zeros(1 << 16, device="cuda", dtype=torch.int32)
    pdl_capable = torch.cuda.get_device_capability()[0] >= 9
    count = LAYERS * len(LAYER)
    print(f"{torch.cuda.get_device_name()}: {count} launches a chain")
    print("| variant | ms a chain | us a launch |")
    print("| --- | --- | --- |")
    rows = []
    for name, run in variants(x, pdl_capable).items():
        run()
        torch.cuda.synchronize()
        ms = _timed_graph(run) * 1e3
        rows.append({"variant": name, "launches": count, "ms": ms})
        print(f"| {name} | {ms:.3f} | {ms * 1e3 / count:.2f} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
