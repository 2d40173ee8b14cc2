"""The CUDA fast path's bookkeeping: batch-size and KV-length buckets, the static input
buffers a captured decode step reads, and the cache of captured CUDA graphs.

A CUDA graph replays fixed kernels on fixed addresses, so a decode step is captured per
(batch bucket, KV bucket): the batch is padded up to the next bucket (1, 2, 4, ..., 64),
and attention reads a fixed number of key positions, the next power of two at least as
long as the longest row (at least `MIN_KV_BUCKET`). Buckets bound the number of graphs
(7 batch sizes x a few lengths) while padding costs at most 2x in rows and in keys read.
Everything here but `DecodeGraphs` capture is plain Python and CPU tensors, tested on
CPU; on CPU the runner runs the same padded step eagerly instead of replaying a graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_KV_BUCKET = 256

# Rows of the static decode input buffer.
TOKENS, POSITIONS, SLOTS = 0, 1, 2


def batch_buckets(max_rows: int, base: Sequence[int] = BATCH_BUCKETS) -> tuple[int, ...]:
    """The batch sizes graphs are captured for: the base buckets below `max_rows`, then
    `max_rows` itself, so that any batch up to it has a bucket and none is wasted past it."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    return (*(b for b in base if b < max_rows), max_rows)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `n` rows."""
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")


def kv_bucket(length: int, capacity: int, minimum: int = MIN_KV_BUCKET) -> int:
    """Key positions a step reads: the next power of two >= `length` (and >= `minimum`),
    capped at the cache's capacity."""
    if length > capacity:
        raise ValueError(f"{length} positions exceed the cache's capacity {capacity}")
    n = max(minimum, 1 << max(0, length - 1).bit_length())
    return min(n, capacity)


def kv_buckets(capacity: int, up_to: int, minimum: int = MIN_KV_BUCKET) -> list[int]:
    """Every KV bucket for lengths 1 ... min(up_to, capacity)."""
    out: list[int] = []
    length = 1
    limit = min(up_to, capacity)
    while length <= limit:
        b = kv_bucket(length, capacity, minimum)
        out.append(b)
        length = b + 1
    return out


@dataclass(frozen=True)
class PaddedStep:
    """One decode step laid out for a bucket: the host rows to copy into the static
    buffer, and where each caller's row is in the padded output."""

    bucket: int
    kv_len: int
    host: torch.Tensor  # (3, bucket) long: tokens, positions, slots
    rows: list[int]  # rows[i]: the output row of the caller's i-th request
    in_order: bool  # rows == [0, 1, ..., n - 1]: the output is a prefix, no gather


def pad_step(
    slots: Sequence[int],
    tokens: Sequence[int],
    positions: Sequence[int],
    *,
    buckets: Sequence[int],
    capacity: int,
    scratch_slot: int,
    min_kv: int = MIN_KV_BUCKET,
) -> PaddedStep:
    """Lay out a decode step whose rows sit in slots 0 ... n - 1 (any order) for the
    batched attention: row s of the padded batch is the request in slot s; rows n ...
    bucket - 1 are padding that read position 0 and write into the scratch slot."""
    n = len(slots)
    if not (n == len(tokens) == len(positions)) or n == 0:
        raise ValueError("a decode step needs one token and position per slot, and a row")
    if sorted(slots) != list(range(n)):
        raise ValueError(f"batched decode needs slots 0..{n - 1}, got {sorted(slots)}")
    bucket = bucket_for(n, buckets)
    kv_len = kv_bucket(max(positions) + 1, capacity, min_kv)
    host = torch.zeros(3, bucket, dtype=torch.long)
    host[SLOTS] = scratch_slot
    for slot, token, pos in zip(slots, tokens, positions, strict=True):
        host[TOKENS, slot] = token
        host[POSITIONS, slot] = pos
        host[SLOTS, slot] = slot
    rows = list(slots)
    return PaddedStep(bucket, kv_len, host, rows, rows == list(range(n)))


Step = Callable[[int, int], torch.Tensor]


class DecodeGraphs:
    """Captured decode steps by (batch bucket, KV bucket), sharing one memory pool.

    `step(bucket, kv_len)` runs one forward that reads the static buffers and returns
    the logits; `run` replays its graph, capturing it on first use. Capture runs the step
    twice eagerly first (on a side stream, as PyTorch asks, so lazy allocations such as
    cuBLAS workspaces happen outside the capture); those runs write the same K/V to the
    same places as the replay will, so they change nothing the replay would not.
    Graphs are never replayed concurrently, so one pool is safe: each graph's outputs
    stay referenced here and are not reused by another capture.
    """

    def __init__(self, step: Step, device: torch.device) -> None:
        self.step = step
        self.device = device
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool: Any = None  # torch's pool handle type (_POOL_HANDLE) is private
        self.capture_s = 0.0

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.graphs

    def capture(self, bucket: int, kv_len: int) -> None:
        t0 = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step(bucket, kv_len)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.step(bucket, kv_len)
        self.graphs[(bucket, kv_len)] = (graph, out)
        dt = time.perf_counter() - t0
        self.capture_s += dt
        log.info("captured decode graph: batch %d, kv %d (%.0f ms)", bucket, kv_len, 1e3 * dt)

    def run(self, bucket: int, kv_len: int) -> torch.Tensor:
        key = (bucket, kv_len)
        if key not in self.graphs:
            self.capture(bucket, kv_len)
        graph, out = self.graphs[key]
        graph.replay()
        return out
