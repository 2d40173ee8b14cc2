"""Block-shape sweep of the engine's int4 kernels over Gemma 4 E2B's projections (issue
18): for each distinct shape, every configuration of a grid much wider than the lists the
autotuner tries (`int4_tuning.GEMV_INT4_CONFIGS`, `MATMUL_INT4_CONFIGS`) is launched
directly, checked against dequantize-then-matmul and timed, beside bf16 cuBLAS and
torch's tinygemm (`_weight_int4pack_mm`) on the same shape.

- one row, `gemv_int4`: BLOCK_N 1-32, BLOCK_K 256-2048, 2/4/8 warps; then the best
  tiles at 1 and 2 warps (up to 64 words a thread); then chunks up to
  the whole row with up to 64 words a thread (`long_chunks`, also when focused); then
  one scale per group rather than per word (`GROUP_SCALES`) on the best tiles, then 1-4 stages on
  the best configurations (split-K 2-16 was tried too, at commit aa41ba2, and never won
  at one row: the kernel no longer has it). Each shape runs in its decode program's form
  (`NORMED`, `PAIRED`, `GATED`), with dependent launch where the GPU has it;
- 2-64 rows, `matmul_int4`: BLOCK_M 16 up to the rows' bucket (16, 32, 64), BLOCK_N
  32-256, BLOCK_K 64-512, 4/8 warps, values made in float32 and converted; then the
  best tiles with the values made two at a time in 16-bit halves (`PAIRS`), then
  split-K, the same way, then splits that fill whole waves of the SMs (`filling_splits`,
  also when focused).
- 64 rows: each shape's best tiles widened to 64 rows, with the rows as the tensor
  cores' long side (`ROWS_FIRST`) and without.
- 2-64 rows: each shape's best with its scales read two to a 32-bit word
  (`SCALE_WORDS`), as they are and pipelined 3 and 4 deep without prefetch.
- both: each shape's best with the next chunk's loads issued before the current chunk's
  work (`PREFETCH`), before the stages phase. `--focused` starts from the autotuner's list
  and the shipped pinned configuration instead of the wide grid, then runs only the
  phases from rows-first on (a short call that retunes after a kernel change).

Timings replay a CUDA graph of the launches over enough weight copies (>= 64 MB, at most
160 launches) that the weights mostly come from HBM. "list" is the best of the
configurations the autotuner may choose today (what it would pick, up to noise); the
suggested list is a greedy choice of at most `--list-size` configurations that minimises
the step's time (each shape weighted by its count in one decode step). Stops at
`--budget-s` and prints what it has.

    python -m benchmarks.int4_gemv_sweep [--out sweep.json] [--rows 1,8] [--budget-s 200]

Needs a CUDA device with Triton. `--dry-run` runs a few configurations on two tiny
shapes on the CPU (under `TRITON_INTERPRET=1`), to check the script before a GPU call.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from triton.runtime._async_compile import AsyncCompileMode

from benchmarks.gemv_h200 import SHAPES, _timed_graph
from benchmarks.int4_h200 import GROUP, _tinygemm
from benchmarks.int4_issue_bound import SMS
from engines.pytorch import (
    dependent_launch,
    int4,
    int4_tuning,
    kernels,
    triton_int4,
    triton_interpreter,
)

STREAM_BYTES = 64 << 20
MAX_COPIES = 160
# The largest split any phase tries (`filling_splits`'): the partial sums' room.
MAX_SPLIT = 16
# The decode program's form of each shape at one row (prologue, epilogue): the merged
# gate/up projections end in their GELU pair, and they, q/k/v and the LM head start with
# the RMSNorm scaled after the product (`programs`, epilogues on); the per-layer gate
# starts with the feed-forward's residual step and ends in a GELU times the per-layer
# input (`kernels.residual_linear`); the rest are plain products.
PAIRED = {"gate_up", "gate_up double"}
NORMED = {"qkv sliding", "qkv full", "q sliding (shared KV)", "q full (shared KV)", "lm head"}
GATED = {"ple gate"}


# Small shapes for `--dry-run`: a plain product, a gate/up pair, a per-layer gate.
TINY_SHAPES = (("o sliding", 64, 512, 2), ("gate_up", 128, 256, 1), ("ple gate", 32, 256, 1))


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        return _timed_graph(fn, 10)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cfg(meta: dict[str, Any], warps: int, stages: int) -> triton.Config:
    return triton.Config(dict(meta), num_warps=warps, num_stages=stages)


_label = int4_tuning.config_label


def _words_a_thread(block_n: int, block_k: int, warps: int, paired: bool = False) -> float:
    # The int32 words of weights each thread of a `gemv_int4` program holds a chunk (a
    # gate/up pair holds a gate and an up row an output).
    return block_n * (2 if paired else 1) * block_k / 8 / (32 * warps)


def gemv_tiles() -> list[triton.Config]:
    """Phase 1 at one row: tiles x warps, a scale per word, no split, two stages; pruned
    to 1-16 int32 words a thread (fewer leaves threads idle, more spills)."""
    out = []
    for bn, bk, w in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048), (2, 4, 8)):
        if 1 <= _words_a_thread(bn, bk, w) <= 16:
            meta = {"BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SCALES": False}
            out.append(_cfg(meta, w, 2))
    return out


def long_chunks(shape: Shape) -> list[triton.Config]:
    """One row: chunks up to the whole row (a masked chunk of the next power of two at
    or above K), with up to 64 int32 words a thread: what `gemv_tiles` leaves out. A
    program's first chunk is loaded before it waits on the kernel before it (dependent
    launch), so a longer one streams more of the weight while that kernel runs."""
    whole = 1 << (shape.k - 1).bit_length()
    out = []
    for bn, bk, w, gs in itertools.product(
        (1, 2, 4, 8, 16), (1024, 2048, 4096, 8192, 16384), (4, 8), (False, True)
    ):
        words_a_thread = _words_a_thread(bn, bk, w, shape.paired)
        if bk <= whole and 1 <= words_a_thread <= 64 and (words_a_thread > 16 or bk > shape.k):
            out.append(_cfg({"BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SCALES": gs}, w, 1))
    return out


def matmul_tiles(rows: int) -> list[triton.Config]:
    """Phase 1 at 2-64 rows: row tiles up to the bucket (one tile of all the rows
    dequantizes each weight tile once), output tiles x input chunks x warps."""
    out = []
    block_ms = [bm for bm in (16, 32, 64) if bm <= kernels.matmul_int4_bucket(rows)]
    for bm, bn, bk, w in itertools.product(
        block_ms, (32, 64, 128, 256), (64, 128, 256, 512), (4, 8)
    ):
        if bn * bk <= 32768 and bm * bk <= 16384:
            meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1}
            out.append(_cfg(meta, w, 3))
    return out


def filling_splits(rows: int, n: int, config: triton.Config) -> list[int]:
    """The splits (up to MAX_SPLIT) that fill the most of 1 to 4 whole waves of an H200's SMs
    with `config`'s tiles, other than the splits phase's 2, 4 and 8: 24 tiles (down at 64
    rows, 64 x 64) make 192 programs split 8, one wave and a half on 132 SMs."""
    meta = config.kwargs
    tiles = -(-rows // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"])
    out = []
    for waves in (1, 2, 3, 4):
        split = SMS * waves // tiles
        if 2 <= split <= MAX_SPLIT and split not in (2, 4, 8, *out):
            out.append(split)
    return out


def _with(config: triton.Config, **changes: int) -> triton.Config:
    meta = dict(config.kwargs)
    stages = changes.pop("num_stages", config.num_stages)
    warps = changes.pop("num_warps", config.num_warps)
    meta.update(changes)
    return _cfg(meta, warps, stages)


class Shape:
    """One projection's weights (copies), inputs and the launches of each kernel form."""

    def __init__(self, name: str, n: int, k: int, count: int, rows: int, dev: torch.device) -> None:
        self.name, self.n, self.k, self.count, self.rows = name, n, k, count, rows
        self.results: dict[str, dict[str, Any]] = {}
        self.refs: dict[str, Any] = {}
        self.dev = dev
        # The interpreter's bfloat16 tl.dot is not faithful: a dry run uses float16.
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float16
        self.paired = rows == 1 and name in PAIRED
        self.normed = rows == 1 and (name in NORMED or self.paired)
        self.gated = rows == 1 and name in GATED
        # The one-row kernel's form of this shape (the pinned table's key holds it).
        self.prologue = kernels.RMS_NORM_AFTER if self.normed else kernels.PLAIN
        self.epilogue = kernels.GELU_PAIR if self.paired else kernels.NO_EPILOGUE
        if self.gated:
            self.prologue, self.epilogue = kernels.RESIDUAL, kernels.GELU_TIMES
        self.n_out = n // 2 if self.paired else n
        self.int4_bytes = n * k // 2 + n * (k // GROUP) * 2
        self.dense_bytes = n * k * 2
        self.copies = min(MAX_COPIES, max(1, math.ceil(STREAM_BYTES / self.int4_bytes)))
        if dev.type != "cuda":  # a dry run checks the script, not the speed
            self.copies = 1
        base = torch.randn(n, k, device=dev, dtype=dtype) / k**0.5
        packed, scale = int4.quantize(base, GROUP)
        self.weights = [(packed.clone(), scale.clone()) for _ in range(self.copies)]
        self.base = base
        self.x = torch.randn(rows, k, device=dev, dtype=dtype)
        self.nw = torch.randn(k, device=dev, dtype=dtype)
        self.y = torch.empty(rows, self.n_out, device=dev, dtype=dtype)
        # The residual step's branch and its norm, the row it writes, the gate's factor.
        self.branch = torch.randn(rows, k, device=dev, dtype=dtype)
        self.x_new = torch.empty(rows, k, device=dev, dtype=dtype)
        self.times = torch.randn(rows, self.n_out, device=dev, dtype=dtype)
        self.part = torch.zeros(MAX_SPLIT * rows * n, device=dev, dtype=torch.float32)
        self.counts = torch.zeros(1 << 18, device=dev, dtype=torch.int32)
        self.pdl = dependent_launch.enabled(dev)
        wf = kernels.dense((packed, scale), torch.float32)
        inputs = self.x.float()
        if self.normed:
            inputs = torch.rms_norm(inputs, (k,), self.nw.float(), 1e-6)
        if self.gated:
            inputs = inputs + torch.rms_norm(self.branch.float(), (k,), self.nw.float(), 1e-6)
        self.ref = inputs @ wf.T
        if self.paired:
            gate, up = self.ref.chunk(2, dim=-1)
            self.ref = F.gelu(gate, approximate="tanh") * up
        if self.gated:
            self.ref = F.gelu(self.ref, approximate="tanh") * self.times.float()

    def gemv_args(self, w: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, ...]:
        # x, branch, norm weight, branch norm, scalar, residual out, multiplier, counter
        # (`kernels`)
        x, count = self.x, self.counts
        if self.gated:
            return (x, self.branch, x, self.nw, x, self.x_new, self.times, count, *w, self.y)
        return (x, x, self.nw, x, x, x, x, count, *w, self.y)

    def gemv_kwargs(self, config: triton.Config) -> dict[str, Any]:
        return {
            "PROLOGUE": self.prologue,
            "SCALE": False,
            "EPILOGUE": self.epilogue,
            "PDL": self.pdl,
            "launch_pdl": self.pdl,
            "GROUP": GROUP,
            **config.kwargs,
            "num_warps": config.num_warps,
            "num_stages": config.num_stages,
        }

    def launch(self, config: triton.Config, w: tuple[torch.Tensor, torch.Tensor]) -> None:
        meta = config.kwargs
        grid: tuple[int, ...]
        if self.rows == 1:
            grid = (-(-self.n_out // meta["BLOCK_N"]),)
            triton_int4.gemv_int4.fn[grid](
                *self.gemv_args(w), self.n_out, self.k, 1e-6, **self.gemv_kwargs(config)
            )
            return
        grid = (-(-self.rows // meta["BLOCK_M"]), -(-self.n // meta["BLOCK_N"]), meta["SPLIT_K"])
        triton_int4.matmul_int4.fn[grid](
            *self.matmul_args(w), **meta, num_warps=config.num_warps, num_stages=config.num_stages
        )

    def matmul_args(self, w: tuple[torch.Tensor, torch.Tensor]) -> tuple[Any, ...]:
        extra = (self.rows, self.n, self.k, kernels.matmul_int4_bucket(self.rows), self.n)
        return (self.x, *w, self.y, self.part, self.counts, self.y, *extra, GROUP)

    def warmup(self, config: triton.Config) -> None:
        w = self.weights[0]
        if self.rows == 1:
            triton_int4.gemv_int4.fn.warmup(
                *self.gemv_args(w), self.n_out, self.k, 1e-6, grid=(1,),
                **self.gemv_kwargs(config),
            )  # fmt: skip
        else:
            triton_int4.matmul_int4.fn.warmup(
                *self.matmul_args(w), **config.kwargs, grid=(1,),
                num_warps=config.num_warps, num_stages=config.num_stages,
            )  # fmt: skip

    def fits(self, config: triton.Config) -> bool:
        # A split only where the row blocks alone leave SMs idle (`triton_int4`), each
        # split with a chunk at least.
        meta = config.kwargs
        split = meta.get("SPLIT_K", 1)
        programs = -(-self.n_out // meta["BLOCK_N"]) * -(-self.rows // meta.get("BLOCK_M", 1))
        if split > MAX_SPLIT or (split > 1 and programs >= int4_tuning.SPLIT_BELOW_PROGRAMS):
            return False
        if meta.get("SCALE_WORDS") and not int4_tuning.scale_words_fit(self.k, GROUP):
            return False
        if self.rows == 1:  # one chunk may cover the whole row, masked past K
            return meta["BLOCK_K"] < 2 * self.k
        return meta["BLOCK_K"] <= self.k and self.k >= split * meta["BLOCK_K"]

    def time(self, config: triton.Config) -> dict[str, Any]:
        self.launch(config, self.weights[0])
        got = self.y.float()
        err = float((got - self.ref).abs().max() / self.ref.abs().max())
        if not err < 0.02:
            return {"config": _label(config), "error": f"max error {err:.3g} of the output"}

        def every_copy() -> None:
            for w in self.weights:
                self.launch(config, w)

        seconds = _timed(every_copy, self.dev)
        seconds /= self.copies
        return {
            "config": _label(config),
            "us": seconds * 1e6,
            "gb_s": self.int4_bytes / seconds / 1e9,
        }

    def references(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        copies = min(MAX_COPIES, max(1, math.ceil(STREAM_BYTES / self.dense_bytes)))
        dense = [self.base.clone() for _ in range(copies)]
        x = self.x
        out["bf16_us"] = 1e6 * _timed(lambda: [F.linear(x, w) for w in dense], self.dev) / copies
        dense.clear()
        try:
            tiles, sz = _tinygemm(self.base)
            tg = [(tiles.clone(), sz.clone()) for _ in range(self.copies)]
            seconds = _timed(
                lambda: [torch._weight_int4pack_mm(x, t, GROUP, s) for t, s in tg], self.dev
            )
            out["tinygemm_us"] = 1e6 * seconds / self.copies
        except Exception as exc:  # recorded: torch's layout may refuse a shape
            out["tinygemm_error"] = f"{type(exc).__name__}: {exc}"[:200]
        return out


def _compile(shapes: list[Shape], configs: Iterable[tuple[Shape, triton.Config]]) -> float:
    """Builds every configuration at once on a thread pool (Triton's async compile: the
    compiler and ptxas run outside the interpreter lock); returns seconds."""
    start = time.monotonic()
    if os.environ.get("TRITON_INTERPRET") == "1":
        return 0.0
    seen = set()
    with ThreadPoolExecutor(16) as pool, AsyncCompileMode(pool, ignore_errors=True):
        for shape, config in configs:
            key = (shape.rows, shape.paired, _label(config))
            if key not in seen:
                seen.add(key)
                shape.warmup(config)
    return time.monotonic() - start


def _list_configs(shape: Shape) -> list[triton.Config]:
    """The configurations the autotuner tries for this shape today."""
    if shape.rows == 1:
        return int4_tuning.GEMV_INT4_CONFIGS
    bucket = kernels.matmul_int4_bucket(shape.rows)
    named = {"N": shape.n, "K": shape.k, "M": shape.rows, "M_BUCKET": bucket}
    return int4_tuning.prune_splits(int4_tuning.MATMUL_INT4_CONFIGS, named)


def pinned_key(shape: Shape) -> tuple[str, str]:
    """(kernel, key) of a shape in a pinned table (`int4_tuning.PINNED_PATH`)."""
    if shape.rows == 1:
        key = int4_tuning.gemv_key(shape.n_out, shape.k, shape.prologue, shape.epilogue, GROUP)
        return "gemv_int4", key
    bucket = kernels.matmul_int4_bucket(shape.rows)
    return "matmul_int4", int4_tuning.matmul_key(bucket, shape.n, shape.k, GROUP)


def _pinned_config(shape: Shape) -> list[triton.Config]:
    """The shipped table's configuration for this shape on this GPU, if it has one."""
    if shape.dev.type != "cuda":
        return []
    pinned = int4_tuning.pinned_config(int4_tuning.gpu_name(), *pinned_key(shape))
    return [] if pinned is None else [pinned]


def sweep(
    shapes: list[Shape],
    deadline: float,
    log: Callable[[str], None],
    few: bool = False,
    focused: bool = False,
) -> None:
    """Fills each shape's `results` (label -> timing), phase by phase (`few`: a handful
    of configurations a phase, for a dry run; `focused`: from the autotuner's list and
    the shipped pinned configuration instead of the wide grid, then straight to the
    prefetch and stages phases)."""

    def run(plan: list[tuple[Shape, triton.Config]], phase: str) -> None:
        plan = [(s, c) for s, c in plan if s.fits(c) and _label(c) not in s.results]
        log(f"{phase}: {len(plan)} timings, compiled in {_compile(shapes, plan):.1f} s")
        for shape, config in plan:
            if time.monotonic() > deadline:
                log(f"{phase}: budget spent")
                return
            try:
                shape.results[_label(config)] = shape.time(config) | {"meta": config}
            except Exception as exc:  # recorded: a configuration that cannot launch
                shape.results[_label(config)] = {"error": f"{type(exc).__name__}: {exc}"[:200]}

    def best(shape: Shape, count: int) -> list[triton.Config]:
        timed = [r for r in shape.results.values() if "us" in r]
        return [r["meta"] for r in sorted(timed, key=lambda r: r["us"])[:count]]

    for shape in shapes:
        shape.refs = shape.references()
    plan = []
    for shape in shapes:
        tiles = gemv_tiles() if shape.rows == 1 else matmul_tiles(shape.rows)
        tiles = tiles[:: len(tiles) // 3] if few else tiles
        if focused:
            tiles = _pinned_config(shape)
        listed = _list_configs(shape)
        if few and shape.rows > 1:  # the interpreter cannot run the pairs' inline PTX
            listed = [_with(c, PAIRS=False) for c in listed]
        plan += [(shape, c) for c in [*listed, *tiles]]
    run(plan, "tiles")
    if shapes[0].rows == 1:
        # The best tiles at one and two warps: a program's reductions and the moves of
        # its input between threads then stay within fewer warps (fewer barriers on the
        # serial path after the kernel's wait), at up to 64 words a thread.
        plan = [
            (s, _with(c, num_warps=w))
            for s in shapes
            for c in best(s, 1 if few else 4)
            for w in (1, 2)
            if w < c.num_warps
            and _words_a_thread(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], w, s.paired) <= 64
        ]
        run(plan, "fewer warps")
    if shapes[0].rows == 1 and not few:
        run([(s, c) for s in shapes for c in long_chunks(s)], "long chunks")
    # A focused sweep skips the group scales, pairs and splits phases.
    if shapes[0].rows == 1 and not focused:
        top = 1 if few else 6
        plan = [(s, _with(c, GROUP_SCALES=True)) for s in shapes for c in best(s, top)]
        run(plan, "group scales")
    elif not focused:
        # The same tiles with the values made two at a time (`PAIRS`), on each shape's
        # best (inline PTX: not in a dry run, which the interpreter runs).
        if not few:
            plan = [(s, _with(c, PAIRS=True)) for s in shapes for c in best(s, 6)]
            run(plan, "pairs")
        top = 1 if few else 4
        splits = (2, 4, 8)
        plan = [(s, _with(c, SPLIT_K=k)) for s in shapes for c in best(s, top) for k in splits]
        run(plan, "splits")
    if shapes[0].rows > 1:
        # Splits that fill whole waves of the SMs (`filling_splits`), on each shape's best.
        top = 1 if few else 3
        plan = [
            (s, _with(c, SPLIT_K=k))
            for s in shapes
            for c in best(s, top)
            for k in filling_splits(s.rows, s.n_out, c)
        ]
        run(plan, "filling splits")
    if shapes[0].rows >= 64 and not few:
        # 64-row tiles with the rows on wgmma's M (`ROWS_FIRST`): each shape's best, and
        # its best tiles widened to all 64 rows (inline PTX: not in a dry run).
        tops = [(s, c) for s in shapes for c in best(s, 4)]
        plan = [(s, _with(c, BLOCK_M=64, ROWS_FIRST=True)) for s, c in tops]
        plan += [(s, _with(c, BLOCK_M=64)) for s, c in tops]
        run(plan, "rows first")
    if shapes[0].rows > 1:
        # The best with their scales read two to a word (`SCALE_WORDS`), which Triton's
        # pipeliner then copies ahead: as they are, and pipelined 3 and 4 deep instead
        # of prefetched.
        top = 1 if few else 4
        plan = [(s, _with(c, SCALE_WORDS=True)) for s in shapes for c in best(s, top)]
        plan += [
            (s, _with(c, SCALE_WORDS=True, PREFETCH=False, num_stages=n))
            for s in shapes
            for c in best(s, top)
            for n in (3, 4)
        ]
        run(plan, "scale words")
    # The best with the next chunk's loads issued before this chunk's work (`PREFETCH`).
    top = 1 if few else 4
    plan = [(s, _with(c, PREFETCH=True)) for s in shapes for c in best(s, top)]
    run(plan, "prefetch")
    top = 1 if few else 3
    plan = [(s, _with(c, num_stages=n)) for s in shapes for c in best(s, top) for n in (1, 2, 3, 4)]
    run(plan, "stages")


def suggest(shapes: list[Shape], size: int) -> list[str]:
    """Greedy: the configuration that most shortens the weighted step, added in turn."""
    chosen: list[str] = []
    labels = {label for s in shapes for label, r in s.results.items() if "us" in r}

    def step_us(pick: list[str]) -> float:
        total = 0.0
        for s in shapes:
            times = [s.results[p]["us"] for p in pick if "us" in s.results.get(p, {})]
            total += s.count * (min(times) if times else 1e6)
        return total

    while len(chosen) < size and labels - set(chosen):
        chosen.append(min(labels - set(chosen), key=lambda label: step_us([*chosen, label])))
    return chosen


def report(shapes: list[Shape], size: int) -> tuple[dict[str, Any], list[str]]:
    rows = shapes[0].rows
    suggested = suggest(shapes, size)
    lines = [
        f"rows {rows}: | projection | N x K | int4 MB | bf16 us | tinygemm us | list us "
        "(GB/s) | suggested us | sweep best us (GB/s) | best configuration |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    out: dict[str, Any] = {"rows": rows, "suggested": suggested, "shapes": []}
    totals = dict.fromkeys(
        ("bf16", "tinygemm", "list", "pinned", "suggested", "best", "best_float_dequant",
         "best_no_prefetch", "best_no_scale_words"),
        0.0,
    )  # fmt: skip
    for s in shapes:
        timed = {label: r for label, r in s.results.items() if "us" in r}
        if not timed:
            continue
        listed = [_label(c) for c in _list_configs(s)]
        pick = min((timed[c] for c in listed if c in timed), key=lambda r: r["us"], default=None)
        sugg = min((timed[c] for c in suggested if c in timed), key=lambda r: r["us"])
        top = min(timed.values(), key=lambda r: r["us"])
        floats = [r for r in timed.values() if not r["meta"].kwargs.get("PAIRS")]
        # None where no configuration made its values in float32 (a focused sweep at
        # 8-64 rows may time none)
        top_float = min(floats, key=lambda r: r["us"], default=None)
        plain = [r for r in timed.values() if not r["meta"].kwargs.get("PREFETCH")]
        by_halves = [r for r in timed.values() if not r["meta"].kwargs.get("SCALE_WORDS")]
        pinned = [timed[c] for c in map(_label, _pinned_config(s)) if c in timed]
        refs = s.refs
        figures = {
            "bf16": refs.get("bf16_us", math.nan),
            "tinygemm": refs.get("tinygemm_us", math.nan),
            "list": pick["us"] if pick else math.nan,
            "suggested": sugg["us"],
            "best": top["us"],
            "best_float_dequant": top_float["us"] if top_float else math.nan,
            "best_no_prefetch": min((r["us"] for r in plain), default=math.nan),
            "best_no_scale_words": min((r["us"] for r in by_halves), default=math.nan),
            # the shipped table's pick, timed with this run's kernel
            "pinned": pinned[0]["us"] if pinned else math.nan,
        }
        for key, value in figures.items():
            totals[key] += s.count * value / 1e3
        lines.append(
            f"| {s.name} | {s.n} x {s.k} | {s.int4_bytes / 1e6:.2f} | {figures['bf16']:.1f} | "
            f"{figures['tinygemm']:.1f} | {figures['list']:.1f} "
            f"({pick['gb_s'] if pick else math.nan:.0f}) | {sugg['us']:.1f} | {top['us']:.1f} "
            f"({top['gb_s']:.0f}) | {top['config']} |"
        )
        out["shapes"].append(
            {
                "name": s.name, "N": s.n, "K": s.k, "count": s.count, "rows": rows,
                "paired": s.paired, "copies": s.copies, "int4_bytes": s.int4_bytes,
                **refs, "list_pick": pick and {k: pick[k] for k in ("config", "us", "gb_s")},
                "best": {k: top[k] for k in ("config", "us", "gb_s")},
                "best_float_dequant": top_float
                and {k: top_float[k] for k in ("config", "us", "gb_s")},
                "timings": [
                    {k: v for k, v in r.items() if k != "meta"} for r in s.results.values()
                ],
            }
        )  # fmt: skip
    out["step_ms"] = totals
    lines.append(
        f"rows {rows}, one step's projections (ms): "
        + ", ".join(f"{k} {v:.3f}" for k, v in totals.items())
    )
    lines.append(f"rows {rows}, suggested list: " + "; ".join(suggested))
    return out, lines


def pin(table_path: str, gpu: str, shapes: list[Shape]) -> int:
    """Writes each shape's best configuration into the engine's pinned table for `gpu`
    (`int4_tuning.PINNED_PATH`'s format; other GPUs and keys kept); returns how many."""
    path = Path(table_path)
    tables = json.loads(path.read_text()) if path.exists() else {}
    pinned = 0
    for s in shapes:
        timed = [r for r in s.results.values() if "us" in r]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["us"])["config"]
        kernel, key = pinned_key(s)
        tables.setdefault(gpu, {}).setdefault(kernel, {})[key] = best
        pinned += 1
    # Sorted keys at every level: a reviewable diff.
    path.write_text(json.dumps(tables, indent=1, sort_keys=True) + "\n")
    return pinned


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.int4_gemv_sweep", description=__doc__)
    p.add_argument("--out")
    p.add_argument("--rows", default="1,8")
    p.add_argument("--budget-s", type=float, default=200.0)
    p.add_argument("--list-size", type=int, default=8)
    p.add_argument("--shapes", help="comma-separated projection names (default: all)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    p.add_argument(
        "--focused",
        action="store_true",
        help="start from the autotuner's list and the pinned table, not the wide grid",
    )
    p.add_argument(
        "--table",
        help="write each shape's best configuration into this pinned table "
        "(the engine's: engines/pytorch/int4_configs.json)",
    )
    args = p.parse_args(argv)
    dev = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        triton_interpreter.fix()
    catalogue = TINY_SHAPES if args.dry_run else SHAPES
    start = time.monotonic()
    wanted = set(args.shapes.split(",")) if args.shapes else None
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (dry run)"
    result: dict[str, Any] = {"gpu": gpu, "group_size": GROUP}
    all_rows = [int(r) for r in args.rows.split(",") if r]
    all_lines: list[str] = []
    for i, rows in enumerate(all_rows):
        # Each row count gets an equal share of what is left.
        left = args.budget_s - (time.monotonic() - start)
        deadline = time.monotonic() + left / (len(all_rows) - i)
        shapes = [
            Shape(name, n, k, count, rows, dev)
            for name, n, k, count in catalogue
            if wanted is None or name in wanted
        ]
        log = lambda line: print(f"[{time.monotonic() - start:.0f}s] {line}", flush=True)  # noqa: E731
        sweep(shapes, deadline, log, few=args.dry_run, focused=args.focused)
        out, lines = report(shapes, args.list_size)
        result[f"rows_{rows}"] = out
        all_lines += lines
        print("\n".join(lines), flush=True)
        if args.table:
            print(f"rows {rows}: {pin(args.table, gpu, shapes)} shapes pinned in {args.table}")
        if args.out:  # after each row count: a stopped run keeps what it measured
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)
        del shapes
        torch.cuda.empty_cache()
    return result


if __name__ == "__main__":
    main()
