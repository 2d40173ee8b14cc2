"""Static bounds of `matmul_int4` at a pinned table's entries, on a machine with no GPU:
each entry's sm_90 build (Triton, specialized as a launch at those rows would be), its
main loop in SASS (`nvdisasm` from Triton's bundle), and from them the time the SMs need
only to issue the loop's instructions, next to the time the product's bytes need at the
copy bandwidth. A product measured far above both is bound by latency (its programs' serial
path: waits on loads, on its own tensor-core groups, on split-K's fixup), not by
instructions or DRAM. Per step: each shape times its count in a decode step of
random:gemma-4-e2b (`gemv_h200.SHAPES`).

Also per entry: how many wgmma groups the loop keeps in flight (`WARPGROUP.DEPBAR.LE gsb0,
n` waits until at most n remain: 0 means each chunk waits for its own product), and the
registers a thread (`ptxas -v`) and shared memory a program, which bound how many of its
programs an SM holds.

Issue time = programs x warps x loop instructions x chunks / (SMs x 4 schedulers x clock):
one instruction a scheduler a clock, prologue and epilogue left out, so a lower bound.

    python -m benchmarks.int4_issue_bound [--bucket 64] [--rows N] [--gpu "NVIDIA H200"]

Prints a table; needs Triton (no GPU).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.gemv_h200 import SHAPES
from engines.pytorch import int4_tuning, triton_int4

# H200 SXM: 132 SMs at 1.98 GHz; copy bandwidth as `int4_h200` measured it
# (`records/2026-12-02-h200-int4-layers.json`).
SMS, CLOCK_GHZ, COPY_GB_S = 132, 1.98, 4173.0
GROUP = 32
SM90 = GPUTarget("cuda", 90, 32)
# `matmul_int4`'s pointers in its order (None: the activations' and scales' dtype).
POINTERS = {"x_ptr": None, "wq_ptr": "*i32", "ws_ptr": None, "y_ptr": None,
            "part_ptr": "*fp32", "count_ptr": "*i32", "m_ptr": None}  # fmt: skip
INTS = ("M", "N", "K", "M_BUCKET", "m_row_stride")
_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$")
_LABEL = re.compile(r"^(\.L_x_\d+):")


@dataclass(frozen=True)
class Bound:
    """One pinned entry's build and its bounds (microseconds, one call)."""

    n: int
    k: int
    config: str
    loop_instructions: int
    in_flight: int | None  # wgmma groups the loop leaves in flight (None: no wgmma)
    registers: int  # a thread, as ptxas allots them
    shared_bytes: int
    chunks: int
    programs: int
    issue_us: float
    bytes_us: float
    per_step: int


def build_matmul_int4(
    config: triton.Config,
    target: GPUTarget,
    dtype: str = "bf16",
    sizes: dict[str, int] | None = None,
) -> Any:
    """`matmul_int4` compiled for `target` at `config`, activations and scales in `dtype`
    ("bf16", "fp16"). With `sizes` (M, N, K, M_BUCKET), specialized as a launch at those
    sizes is: its pointers 16-byte aligned and each size that is a multiple of 16 marked so;
    without, nothing is assumed (as the build tests compile every configuration)."""
    if sizes is not None:  # the multiplier a plain launch is given: y, N to a row
        sizes = {"m_row_stride": sizes["N"], **sizes}
    kinds = {name: kind or f"*{dtype}" for name, kind in POINTERS.items()}
    signature = kinds | dict.fromkeys(INTS, "i32")
    constants = {"GROUP": GROUP, **config.kwargs}
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(signature)
        if sizes is not None and (name in POINTERS or sizes[name] % 16 == 0)
    }
    source = ASTSource(
        fn=triton_int4.matmul_int4.fn,
        signature=signature | dict.fromkeys(constants, "constexpr"),
        constexprs=constants,
        attrs=aligned,
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(source, target=target, options=options)


def main_loop(sass: str) -> list[str]:
    """The instructions of the longest loop (a branch back to a lower address)."""
    labels: dict[str, int] = {}
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    for raw in sass.splitlines():
        if label := _LABEL.match(raw.strip()):
            pending.append(label.group(1))
        elif line := _LINE.match(raw):
            address = int(line.group(1), 16)
            labels.update(dict.fromkeys(pending, address))
            pending = []
            lines.append((address, line.group(2)))
    best: list[str] = []
    for address, text in lines:
        target = re.search(r"\bBRA\b.*?(\.L_x_\d+)", text)
        start = labels.get(target.group(1), address) if target else address
        if start < address:
            body = [t for a, t in lines if start <= a <= address]
            best = body if len(body) > len(best) else best
    return best


def sass(built: Any) -> str:
    """A compiled kernel's SASS (`nvdisasm` from Triton's bundle)."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp, "kernel.cubin")
        cubin.write_bytes(built.asm["cubin"])
        return subprocess.run(
            [str(_BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True
        ).stdout


def registers(built: Any) -> int:
    """The registers a thread of `built` uses, as ptxas (Triton's) reports them."""
    return ptxas_usage(built)[0]


def ptxas_usage(built: Any) -> tuple[int, int]:
    """The registers a thread of `built` uses and its stack frame in bytes (local memory a
    thread: values that did not fit the registers, each a round trip through L1), as
    ptxas (Triton's) reports them."""
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp, "kernel.ptx")
        ptx.write_text(built.asm["ptx"])
        out = subprocess.run(
            [str(_BIN / "ptxas"), "-v", "-arch=sm_90a", str(ptx), "-o", str(Path(tmp, "k.o"))],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    used = int(re.findall(r"Used (\d+) registers", out)[0])
    return used, int(re.findall(r"(\d+) bytes stack frame", out)[0])


def bound(rows: int, bucket: int, n: int, k: int, label: str, per_step: int) -> Bound:
    config = int4_tuning.config_from_label(label)
    meta = config.kwargs
    sizes = {"M": rows, "N": n, "K": k, "M_BUCKET": bucket}
    built = build_matmul_int4(config, SM90, sizes=sizes)
    loop = main_loop(sass(built))
    waits = [int(m.group(1), 16) for t in loop if (m := re.search(r"DEPBAR\.LE gsb0, (0x\w+)", t))]
    in_flight = min(waits) if waits else None
    split = meta["SPLIT_K"]
    chunks = -(-k // (meta["BLOCK_K"] * split))
    programs = -(-rows // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"]) * split
    warp_instructions = programs * config.num_warps * len(loop) * chunks
    issue_us = warp_instructions / (SMS * 4 * CLOCK_GHZ * 1e3)
    moved = n * k // 2 + n * (k // GROUP) * 2 + rows * (k + n) * 2  # int4, scales, x and y
    bytes_us = moved / (COPY_GB_S * 1e3)
    return Bound(n, k, label, len(loop), in_flight, registers(built), built.metadata.shared,
                 chunks, programs, issue_us, bytes_us, per_step)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bucket", type=int, default=64, help="rows the table pins (16, 64)")
    parser.add_argument("--rows", type=int, default=None, help="rows served (default: the bucket)")
    parser.add_argument("--gpu", default="NVIDIA H200", help="the pinned table's GPU")
    parser.add_argument("--only", default=None, help="one shape, N,K")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = args.rows or args.bucket
    table = int4_tuning.pinned_tables().get(args.gpu, {}).get("matmul_int4", {})
    counts: dict[tuple[int, int], int] = {}
    for _name, n, k, count in SHAPES:
        counts[(n, k)] = counts.get((n, k), 0) + count
    entries = []
    for key, label in table.items():
        bucket, n, k, group = map(int, key.split(","))
        if bucket == args.bucket and group == GROUP and args.only in (None, f"{n},{k}"):
            entries.append((n, k, label))
    if not entries:
        only = f" at {args.only}" if args.only else ""
        parser.error(f"no {args.gpu!r} matmul_int4 entry for bucket {args.bucket}{only}")
    print("| N x K | config | loop | wgmma in flight | registers | shared KB | chunks | programs "
          "| issue us | bytes us |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    bounds = []
    for n, k, label in entries:
        b = bound(rows, args.bucket, n, k, label, counts.get((n, k), 0))
        bounds.append(b)
        flight = "no wgmma" if b.in_flight is None else b.in_flight
        print(f"| {n} x {k} | {label} | {b.loop_instructions} | {flight} | {b.registers} | "
              f"{b.shared_bytes / 1024:.0f} | {b.chunks} | "
              f"{b.programs} | {b.issue_us:.1f} | {b.bytes_us:.1f} |", flush=True)  # fmt: skip
    issue = sum(b.issue_us * b.per_step for b in bounds)
    moved = sum(b.bytes_us * b.per_step for b in bounds)
    print(f"a decode step's {sum(b.per_step for b in bounds)} products: issue {issue:.0f} us, "
          f"bytes {moved:.0f} us (each a lower bound)")  # fmt: skip
    if args.out:
        record: dict[str, Any] = {"gpu": args.gpu, "rows": rows, "bucket": args.bucket, "sms": SMS,
                                  "clock_ghz": CLOCK_GHZ, "copy_gb_s": COPY_GB_S,
                                  "bounds": [asdict(b) for b in bounds]}  # fmt: skip
        Path(args.out).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
