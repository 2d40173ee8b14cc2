"""The batch-1 decode attention of Gemma 4 E2B's 35 layers on one GPU, as the served step
runs it: `attention_kernel.decode_attention_normed` a layer (the partial kernel from the
q/k/v row, then the combine), launched as dependents and replayed in a CUDA graph, at
the last position of a 128-in / 512-out request (639 of a 1,024-key bucket; sliding
layers see the last 512 keys; the first 15 layers write KV, the other 20 read layer 13's
or 14's). Beside it, the floor: the same 70 launches of kernels that do nothing but the
dependent launch's two instructions. With `--kernels NAME=PATH`, the same chain through
another version of `engines/pytorch/triton_attention.py` (e.g. `git show
REV:engines/pytorch/triton_attention.py > old.py`), in the same run: an A/B of a kernel
change without the served step's other 228 kernels around it.

    python -m benchmarks.attention_h200 [--kernels before=old.py ...] [--knobs] [--out result.json]

`--knobs` also times the engine's kernels at each choice of keys a block (16, 32, 64),
partial-kernel warps for heads 256 / 512 wide (2/4, 4/8, 8/8) and combine warps (4, 8).

Prints a table; needs a CUDA device with Triton (dependent launch: compute capability 9+).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

LAYERS, WRITERS, HEADS, POSITION, BUCKET, WINDOW = 35, 15, 8, 639, 1024, 512


@dataclass(frozen=True)
class Layer:
    head_dim: int
    writes_kv: bool
    sliding: bool


def e2b_layers() -> list[Layer]:
    """E2B's attention layers: four sliding (heads 256 wide) to one full (512)."""
    return [
        Layer(512 if i % 5 == 4 else 256, i < WRITERS, i % 5 != 4) for i in range(LAYERS)
    ]


def _inputs(layers: list[Layer], device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's arguments to `decode_attention_normed`, its pools shared as E2B's are."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(device)

    pools: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    keys = torch.arange(BUCKET)
    out = []
    for layer in layers:
        d = layer.head_dim
        if layer.writes_kv:
            pools[d] = (rand(1, 1, BUCKET, d), rand(1, 1, BUCKET, d))
        visible = keys <= POSITION
        if layer.sliding:
            visible &= keys > POSITION - WINDOW
        angles = torch.rand(1, d // 2, generator=gen) * 3.0
        qkv = rand(1, (HEADS + (2 if layer.writes_kv else 0)) * d, scale=2.0)
        out.append((
            qkv, rand(d, scale=0.25), rand(d, scale=0.25),
            torch.cat([angles.cos()] * 2, -1).to(torch.bfloat16).to(device),
            torch.cat([angles.sin()] * 2, -1).to(torch.bfloat16).to(device),
            torch.tensor([POSITION], device=device), *pools[d],
            (~visible).view(1, 1, 1, BUCKET).to(device),
        ))  # fmt: skip
    return out


def _module(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"attention_{name}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"attention_h200: cannot load kernels from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chain(
    kernels: ModuleType, layers: list[Layer], inputs: list[tuple[torch.Tensor, ...]]
) -> tuple[Callable[[], None], list[torch.Tensor]]:
    """The 35 layers' attention through `kernels` (a `triton_attention`), and its outputs."""
    from engines.pytorch import attention_kernel

    outputs: list[torch.Tensor] = []

    def run() -> None:
        original = attention_kernel._kernels
        attention_kernel._kernels = lambda: kernels  # type: ignore[assignment]
        try:
            outputs.clear()
            for layer, args in zip(layers, inputs, strict=True):
                outputs.append(attention_kernel.decode_attention_normed(
                    *args, HEADS, layer.writes_kv, 1.0, 1e-6
                ))  # fmt: skip
        finally:
            attention_kernel._kernels = original  # type: ignore[assignment]

    return run, outputs


def floor(layers: list[Layer], device: torch.device) -> Callable[[], None]:
    """The chain's launches, each doing nothing but a dependent launch's wait."""
    from benchmarks.boundary_floor_h200 import boundary
    from engines.pytorch import attention_kernel

    x = torch.zeros(64, dtype=torch.int32, device=device)
    _block_l, blocks, _block_g = attention_kernel.split(BUCKET, HEADS)

    def run() -> None:
        for layer in layers:
            warps = attention_kernel.partial_warps(layer.head_dim)
            boundary[(1, blocks)](x, PDL=True, TOUCH=False, num_warps=warps, launch_pdl=True)
            boundary[(HEADS,)](
                x, PDL=True, TOUCH=False, num_warps=attention_kernel.COMBINE_WARPS,
                launch_pdl=True,
            )  # fmt: skip

    return run


def knobs(layers: list[Layer], device: torch.device) -> list[dict[str, object]]:
    """The engine's chain at each split and warps choice (`attention_kernel`'s, patched)."""
    from benchmarks.gemv_h200 import _timed_graph
    from engines.pytorch import attention_kernel, triton_attention

    shipped = attention_kernel.split, attention_kernel.partial_warps, attention_kernel.COMBINE_WARPS
    rows: list[dict[str, object]] = []
    print("| keys a block | partial warps (256 / 512) | combine warps | ms a chain | us a layer |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for block_l, warps, combine in itertools.product(
            (16, 32, 64), ((2, 4), (4, 8), (8, 8)), (4, 8)
        ):
            attention_kernel.split = lambda kv, group, bl=block_l: (  # type: ignore[assignment]
                bl, -(-kv // bl), shipped[0](kv, group)[2]
            )
            attention_kernel.partial_warps = lambda d, w=warps: w[1] if d >= 512 else w[0]  # type: ignore[assignment]
            attention_kernel.COMBINE_WARPS = combine
            run, _ = chain(triton_attention, layers, _inputs(layers, device))
            run()
            ms = _timed_graph(run) * 1e3
            rows.append({"keys_a_block": block_l, "partial_warps": warps,
                         "combine_warps": combine, "ms": ms})  # fmt: skip
            print(f"| {block_l} | {warps[0]} / {warps[1]} | {combine} | {ms:.4f} "
                  f"| {ms * 1e3 / LAYERS:.2f} |", flush=True)  # fmt: skip
    finally:
        attention_kernel.split, attention_kernel.partial_warps = shipped[:2]  # type: ignore[assignment]
        attention_kernel.COMBINE_WARPS = shipped[2]
    return rows


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gemv_h200 import _timed_graph
    from engines.pytorch import dependent_launch, triton_attention

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--knobs", action="store_true", help="also each split and warps choice")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    if not dependent_launch.enabled(device):
        raise SystemExit("attention_h200: needs dependent launch (compute capability 9+)")
    layers = e2b_layers()
    variants = {"engine": triton_attention}
    for spec in args.kernels:
        name, _, path = spec.partition("=")
        if not path or not Path(path).is_file():
            raise SystemExit(f"attention_h200: --kernels wants NAME=PATH of a file, got {spec!r}")
        variants[name] = _module(name, path)
    floor_ms = _timed_graph(floor(layers, device)) * 1e3
    print(f"{torch.cuda.get_device_name()}: {LAYERS} layers, 2 launches a layer")
    print("| variant | ms a chain | us a layer | us a layer over the floor | largest difference |")
    print("| --- | --- | --- | --- | --- |")
    floor_us = floor_ms * 1e3 / LAYERS
    print(f"| floor (empty dependent launches) | {floor_ms:.4f} | {floor_us:.2f} | | |")
    rows: list[dict[str, object]] = [{"variant": "floor", "ms": floor_ms}]
    reference: list[torch.Tensor] = []
    for name, kernels in variants.items():
        # Fresh pools a variant: the writers' new rows land in them as the step's would.
        run, outputs = chain(kernels, layers, _inputs(layers, device))
        run()
        torch.cuda.synchronize()
        got = [o.float().clone() for o in outputs]
        reference = reference or got
        difference = max((a - b).abs().max().item() for a, b in zip(got, reference, strict=True))
        ms = _timed_graph(run) * 1e3
        over = (ms - floor_ms) * 1e3 / LAYERS
        rows.append({"variant": name, "ms": ms, "largest_difference": difference})
        print(f"| {name} | {ms:.4f} | {ms * 1e3 / LAYERS:.2f} | {over:.2f} | {difference:.3g} |",
              flush=True)  # fmt: skip
    knob_rows = knobs(layers, device) if args.knobs else []
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows, "knobs": knob_rows},
                      f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
