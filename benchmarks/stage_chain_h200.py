"""What a kernel boundary costs in the batch-1 int4 step, and whether a wait inside one
launch costs less (issue 18: the step is about 300 launches whose products run at a
fraction of the copy bandwidth; the products alone, as a chain, take 0.9 ms where their
bytes need 0.36).

The same chain of int4 matrix-vector products runs three ways, each replayed in a CUDA
graph over weights too large for L2 (E2B's sliding-layer shapes, q/k/v 2560 x 1536, o
1536 x 2048, gate/up 12288 x 1536, down 1536 x 6144, per-layer gate 256 x 1536 and
projection 1536 x 256, for LAYERS layers; each stage reads the first K outputs of the
one before):
- `launches`: one launch a product of `stage_gemv` (the engine's own program,
  `triton_int4.gemv_int4_tile`, at one fixed configuration), as a
  dependent launch (its first chunk of weights loads before `griddepcontrol.wait`), and
  the same without dependent launches;
- `engine`: one launch a product through the engine's own `kernels.linear` (`gemv_int4`,
  its pinned configuration a shape, dependent launches): what `stage_gemv`'s one
  configuration costs against the tuned ones;
- `chained`: one launch of `chained_gemv` for a layer's stages, or for the whole chain:
  each program takes a ticket (an atomic counter, so tickets follow the order in which
  programs start), finds its stage and tile, loads its first chunk of weights, then waits
  until every tile of the stage before has counted itself done, and counts itself done
  once its outputs are stored. A stage's programs so stream weights while the stage
  before still runs, and a stage starts when its input is written, not when a launch
  drains. The whole chain also runs as a few persistent programs an SM, each drawing
  tickets until they run out (`--programs-per-sm`). `launches` and `chained` share the
  tile's arithmetic (their outputs are compared bit for bit), so the difference is the
  boundary.

    python -m benchmarks.stage_chain_h200 [--layers 35] [--out result.json]
    TRITON_INTERPRET=1 python -m benchmarks.stage_chain_h200 --dry-run   # on the CPU

Prints a table; needs a CUDA device with Triton (compute capability 9.0 for the
dependent launches). Tickets rather than program ids: a program waits only on tiles of
lower tickets, which are already running or done, so the chain cannot deadlock however
the GPU orders its programs (`tests/engines/pytorch/test_stage_chain.py` checks the
arithmetic and the protocol in Triton's interpreter, which runs programs one by one).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from engines.pytorch import int4, kernels
from engines.pytorch.triton_int4 import gemv_int4_tile

GROUP_SIZE = 32
GROUP = tl.constexpr(GROUP_SIZE)  # what the kernels read
ALIGN = 8
# (name, outputs, inputs) of one E2B sliding layer's products, in the step's order.
LAYER = (
    ("qkv", 2560, 1536),
    ("o", 1536, 2048),
    ("gate_up", 12288, 1536),
    ("down", 1536, 6144),
    ("ple gate", 256, 1536),
    ("ple proj", 1536, 256),
)
# `--dry-run`'s layer: ragged against its tile (40 outputs in tiles of 16) and against its
# chunk (inputs of 32, 96 and 128 in chunks of 64).
DRY_RUN_LAYER = (
    ("a", 96, 64),
    ("b", 40, 96),
    ("c", 128, 32),
    ("d", 64, 128),
    ("e", 32, 64),
    ("f", 64, 32),
)


@triton.jit
def stage_gemv(
    x_ptr, wq_ptr, ws_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # The engine's plain int4 product (`gemv_int4`'s program) at one fixed tile.
    gemv_int4_tile(
        tl.program_id(0), tl.num_programs(0), x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr,
        wq_ptr, wq_ptr, ws_ptr, y_ptr, N, K, 0.0, wq_ptr, 0, 0, False, 0, PDL, GROUP, BLOCK_N,
        BLOCK_K, True, False, False,
    )  # fmt: skip


@triton.jit
def _ticket_task(
    ticket, acts_ptr, wq_ptr, ws_ptr, starts_ptr, n_ptr, k_ptr, w_at_ptr, s_at_ptr, x_at_ptr,
    y_at_ptr, done_ptr, STAGES: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Tables per stage: its first ticket, N, K, where its packed words and scales start,
    # where its input and output start in acts; done counts each stage's finished tiles.
    # The tile is `stage_gemv`'s, waiting for every tile of the stage before (none for
    # the first). True for the tile that finishes the launch's last stage.
    firsts = tl.load(starts_ptr + tl.arange(0, BLOCK_S), mask=tl.arange(0, BLOCK_S) < STAGES,
                     other=2**31 - 1)  # fmt: skip
    stage = tl.sum((firsts <= ticket).to(tl.int32), axis=0) - 1
    first = tl.load(starts_ptr + stage)
    before = tl.maximum(stage - 1, 0)
    tiles_before = tl.where(stage > 0, first - tl.load(starts_ptr + before), 0)
    n = tl.load(n_ptr + stage)
    k = tl.multiple_of(tl.load(k_ptr + stage), GROUP)
    wq = wq_ptr + tl.multiple_of(tl.load(w_at_ptr + stage), 8)
    ws = ws_ptr + tl.multiple_of(tl.load(s_at_ptr + stage), 8)
    x = acts_ptr + tl.multiple_of(tl.load(x_at_ptr + stage), 8)
    y = acts_ptr + tl.multiple_of(tl.load(y_at_ptr + stage), 8)
    tiles = (n + BLOCK_N - 1) // BLOCK_N
    gemv_int4_tile(
        ticket - first, tiles, x, x, x, x, x, x, x, wq, wq, ws, y, n, k, 0.0,
        done_ptr + before, tiles_before, 0, False, 0, False, GROUP, BLOCK_N, BLOCK_K, True,
        False, True,
    )  # fmt: skip
    tl.debug_barrier()
    finished = tl.atomic_add(done_ptr + stage, 1, sem="release")
    return (stage == STAGES - 1) & (finished == tiles - 1)


@triton.jit
def chained_gemv(
    acts_ptr, wq_ptr, ws_ptr, starts_ptr, n_ptr, k_ptr, w_at_ptr, s_at_ptr, x_at_ptr,
    y_at_ptr, done_ptr, ticket_ptr, exits_ptr, tickets, STAGES: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PERSISTENT: tl.constexpr,
):  # fmt: skip
    # One ticket a program (a grid of `tickets`), or PERSISTENT: a few programs an SM, each
    # drawing tickets until they run out. Either way a ticket drawn later never blocks
    # one drawn earlier. The counters are zero again when the launch ends.
    everyone = tl.arange(0, BLOCK_S)
    if PERSISTENT:
        ticket = tl.atomic_add(ticket_ptr, 1)
        while ticket < tickets:
            _ticket_task(
                ticket, acts_ptr, wq_ptr, ws_ptr, starts_ptr, n_ptr, k_ptr, w_at_ptr, s_at_ptr,
                x_at_ptr, y_at_ptr, done_ptr, STAGES, BLOCK_S, BLOCK_N, BLOCK_K,
            )  # fmt: skip
            ticket = tl.atomic_add(ticket_ptr, 1)
        # The last program out: every ticket is drawn and done.
        if tl.atomic_add(exits_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
            tl.store(done_ptr + everyone, tl.zeros((BLOCK_S,), tl.int32), mask=everyone < STAGES)
            tl.atomic_xchg(ticket_ptr, 0)
            tl.atomic_xchg(exits_ptr, 0)
    else:
        last = _ticket_task(
            tl.atomic_add(ticket_ptr, 1), acts_ptr, wq_ptr, ws_ptr, starts_ptr, n_ptr, k_ptr,
            w_at_ptr, s_at_ptr, x_at_ptr, y_at_ptr, done_ptr, STAGES, BLOCK_S, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        if last:
            # Every ticket is drawn and every wait passed.
            tl.store(done_ptr + everyone, tl.zeros((BLOCK_S,), tl.int32), mask=everyone < STAGES)
            tl.atomic_xchg(ticket_ptr, 0)


@dataclass
class Chain:
    """The chain's weights (each stage's int4 pair, and all of them end to end), its
    activations (the input, then each stage's output) and where each stage's parts lie."""

    stages: list[tuple[str, int, int]]
    weights: list[tuple[torch.Tensor, torch.Tensor]]
    packed: torch.Tensor
    scales: torch.Tensor
    acts: torch.Tensor
    w_at: list[int]
    s_at: list[int]
    x_at: list[int]
    y_at: list[int]


def _aligned(count: int) -> int:
    # Every stage's parts start on 16 bytes (8 of the widest element here) and the
    # kernel says so (`tl.multiple_of`): its loads vectorize as a launch's own arguments'.
    return -(-count // ALIGN) * ALIGN


def build(
    layers: int, device: str, dtype: torch.dtype, layer: tuple = LAYER, seed: int = 0
) -> Chain:
    gen = torch.Generator(device=device).manual_seed(seed)
    stages = [stage for _ in range(layers) for stage in layer]
    weights, w_at, s_at, x_at, y_at = [], [], [], [], []
    words = groups = 0
    at = _aligned(stages[0][2])
    for _name, n, k in stages:
        w = torch.randn(n, k, generator=gen, device=device, dtype=torch.float32) / k**0.5
        packed, scale = int4.quantize(w.to(dtype), GROUP_SIZE)
        weights.append((packed, scale))
        w_at.append(words)
        s_at.append(groups)
        words = _aligned(words + packed.numel())
        groups = _aligned(groups + scale.numel())
        x_at.append(y_at[-1] if y_at else 0)
        y_at.append(at)
        at = _aligned(at + n)
    packed_all = torch.zeros(words, device=device, dtype=torch.int32)
    scales_all = torch.zeros(groups, device=device, dtype=dtype)
    for (packed, scale), w0, s0 in zip(weights, w_at, s_at, strict=True):
        packed_all[w0 : w0 + packed.numel()] = packed.flatten()
        scales_all[s0 : s0 + scale.numel()] = scale.flatten()
    acts = torch.zeros(at, device=device, dtype=dtype)
    acts[: stages[0][2]] = torch.randn(stages[0][2], generator=gen, device=device).to(dtype)
    return Chain(stages, weights, packed_all, scales_all, acts, w_at, s_at, x_at, y_at)


def reference(chain: Chain, inputs: torch.Tensor | None = None) -> torch.Tensor:
    """The chain's outputs in float32 from the dequantized weights, each stage's output
    rounded to the activations' dtype as the kernels store it; with `inputs` (a run's
    activations), each stage multiplies its input as found there (one stage's error)."""
    acts = chain.acts.clone()
    read = acts if inputs is None else inputs
    for (_name, n, k), (packed, scale), x0, y0 in zip(
        chain.stages, chain.weights, chain.x_at, chain.y_at, strict=True
    ):
        w = int4.dequantize(packed, scale, torch.float32)
        acts[y0 : y0 + n] = (w @ read[x0 : x0 + k].float()).to(acts.dtype)
    return acts


def run_engine(chain: Chain) -> torch.Tensor:
    # Each product reads the first K of the one before's own output (a (1, N) row's
    # first K columns are contiguous: no copy).
    x = chain.acts[: chain.stages[0][2]].view(1, -1)
    for (_name, _n, k), weight in zip(chain.stages, chain.weights, strict=True):
        x = kernels.linear(x[:, :k], weight)
    return x.view(-1)


def run_launches(chain: Chain, block_n: int, block_k: int, warps: int, pdl: bool) -> None:
    for (_name, n, k), (packed, scale), x0, y0 in zip(
        chain.stages, chain.weights, chain.x_at, chain.y_at, strict=True
    ):
        stage_gemv[(triton.cdiv(n, block_n),)](
            chain.acts[x0:], packed, scale, chain.acts[y0:], n, k, BLOCK_N=block_n,
            BLOCK_K=block_k, PDL=pdl, num_warps=warps, launch_pdl=pdl,
        )  # fmt: skip


@dataclass
class Launch:
    """One `chained_gemv` launch: its tables on the device and its counters."""

    tables: tuple[torch.Tensor, ...]
    done: torch.Tensor
    ticket: torch.Tensor
    exits: torch.Tensor
    stages: int
    tickets: int


def plan(chain: Chain, group: int, block_n: int) -> list[Launch]:
    """The chain as launches of `group` consecutive stages each."""
    device = chain.acts.device
    launches = []
    for first in range(0, len(chain.stages), group):
        part = range(first, min(first + group, len(chain.stages)))
        tiles = [triton.cdiv(chain.stages[i][1], block_n) for i in part]
        starts = [sum(tiles[:j]) for j in range(len(tiles))]
        columns = (
            starts, [chain.stages[i][1] for i in part], [chain.stages[i][2] for i in part],
            [chain.w_at[i] for i in part], [chain.s_at[i] for i in part],
            [chain.x_at[i] for i in part], [chain.y_at[i] for i in part],
        )  # fmt: skip
        tables = tuple(
            torch.tensor(c, dtype=torch.int32 if j < 3 else torch.int64, device=device)
            for j, c in enumerate(columns)
        )
        launches.append(
            Launch(
                tables,
                torch.zeros(len(part), dtype=torch.int32, device=device),
                torch.zeros(1, dtype=torch.int32, device=device),
                torch.zeros(1, dtype=torch.int32, device=device),
                len(part),
                sum(tiles),
            )
        )
    return launches


def run_chained(
    chain: Chain,
    launches: list[Launch],
    block_n: int,
    block_k: int,
    warps: int,
    programs: int | None = None,
) -> None:
    """Each launch as a program a ticket, or as `programs` persistent programs."""
    for launch in launches:
        grid = launch.tickets if programs is None else min(programs, launch.tickets)
        chained_gemv[(grid,)](
            chain.acts, chain.packed, chain.scales, *launch.tables, launch.done, launch.ticket,
            launch.exits, launch.tickets, STAGES=launch.stages,
            BLOCK_S=triton.next_power_of_2(launch.stages), BLOCK_N=block_n, BLOCK_K=block_k,
            PERSISTENT=programs is not None, num_warps=warps,
        )  # fmt: skip


def _timed_once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=35)
    parser.add_argument("--block-n", type=int, default=8)
    parser.add_argument("--block-k", type=int, default=2048)
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument(
        "--programs-per-sm", type=int, default=4, help="the persistent variant's grid, per SM"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="two layers of tiny products on the CPU (under TRITON_INTERPRET=1), timed by "
        "the wall clock: checks the script, not the speed",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        from engines.pytorch import triton_interpreter

        triton_interpreter.fix()
        chain = build(2, "cpu", torch.bfloat16, DRY_RUN_LAYER)
        args.layers, args.block_n, args.block_k = 2, 16, 64
        timed = _timed_once
    else:
        from benchmarks.gemv_h200 import _timed_graph as timed

        chain = build(args.layers, "cuda", torch.bfloat16)
    want = reference(chain)
    tile = (args.block_n, args.block_k, args.warps)
    per_layer = plan(chain, len(chain.stages) // args.layers, args.block_n)
    whole = plan(chain, len(chain.stages), args.block_n)
    pdl = chain.acts.is_cuda and torch.cuda.get_device_capability()[0] >= 9
    sms = torch.cuda.get_device_properties().multi_processor_count if chain.acts.is_cuda else 2
    persistent = args.programs_per_sm * sms
    variants = {
        "launches": (lambda: run_launches(chain, *tile, pdl=pdl), len(chain.stages)),
        "launches, no PDL": (lambda: run_launches(chain, *tile, pdl=False), len(chain.stages)),
        "engine": (lambda: run_engine(chain), len(chain.stages)),
        "chained, a launch a layer": (lambda: run_chained(chain, per_layer, *tile), args.layers),
        "chained, one launch": (lambda: run_chained(chain, whole, *tile), 1),
        "chained, one launch, persistent": (
            lambda: run_chained(chain, whole, *tile, programs=persistent),
            1,
        ),
    }
    mbytes = sum(p.numel() * 4 + s.numel() * s.element_size() for p, s in chain.weights) / 1e6
    print(
        f"{args.layers} layers, {len(chain.stages)} products, {mbytes:.0f} MB of int4 weights;"
        f" tile block_n={args.block_n}, block_k={args.block_k}, w={args.warps}"
    )
    print("| variant | launches | ms a chain | GB/s | us a boundary saved vs launches | "
          "max rel error | same outputs as launches |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    last = slice(chain.y_at[-1], chain.y_at[-1] + chain.stages[-1][1])
    rows: list[dict[str, Any]] = []
    finals: dict[str, torch.Tensor] = {}
    # The chained variants run last and each row is printed and saved as it is measured:
    # a launch that never finishes (a protocol bug) loses nothing measured before it.
    for name, (fn, count) in variants.items():
        chain.acts[chain.stages[0][2] :] = 0
        out = fn()
        if chain.acts.is_cuda:
            torch.cuda.synchronize()
        final = finals[name] = (chain.acts[last] if out is None else out).clone()
        ms = timed(fn) * 1e3
        removed = len(chain.stages) - count
        base_ms = next((r["ms"] for r in rows if r["variant"] == "launches"), float("nan"))
        row = {
            "variant": name,
            "launches": count,
            "ms": ms,
            "gb_per_s": mbytes / ms,
            "us_saved_per_boundary": (base_ms - ms) * 1e3 / removed if removed else None,
            "max_rel_error": _error(final, want[last]),
            "same_as_launches": bool(torch.equal(final, finals["launches"])),
        }
        rows.append(row)
        saved = row["us_saved_per_boundary"]
        saved = "" if saved is None else f"{saved:.2f}"
        print(f"| {name} | {count} | {ms:.3f} | {row['gb_per_s']:.0f} | {saved} | "
              f"{row['max_rel_error']:.1e} | {row['same_as_launches']} |", flush=True)  # fmt: skip
        if args.out:
            with open(args.out, "w") as f:
                record = {"layers": args.layers, "mbytes": mbytes, "tile": tile, "rows": rows}
                json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
