"""The device side of the PyTorch scheduler's decode steps: reading chosen tokens back
without stalling (`TokenReadback`, `InFlight`, for asynchronous decode), and timing each
step's device work and the idle gaps between steps (`DeviceClock`, for `/metrics`).

CUDA events and pinned buffers only; on CPU both fall back to doing nothing special.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from engines.serving.metrics import EngineMetrics

__all__ = ["DeviceClock", "InFlight", "TokenReadback"]

log = logging.getLogger(__name__)

RowT = TypeVar("RowT")


@dataclass
class InFlight(Generic[RowT]):
    """A decode step queued on the device whose tokens the host has not read yet."""

    rows: list[RowT]  # the scheduler's sequences, in row order
    tokens: torch.Tensor  # (rows,) on the device: fed to the next step as they are
    host: torch.Tensor  # (rows,) their copy on the host (pinned on CUDA)
    ready: torch.cuda.Event | None  # recorded after that copy; None: already there
    row_of: dict[int, int] = field(default_factory=dict)  # id(seq) -> row
    clock_turn: int | None = None  # its `DeviceClock` events

    def wait(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()  # releases the GIL while the device works
        return self.host.tolist()


class TokenReadback:
    """Two pinned host buffers and events for the chosen tokens of in-flight steps, used
    in turn: step n + 1 copies into one while the host reads step n's from the other,
    and a buffer is reused two steps later, after its tokens were read. Allocated
    once, so a step makes no pinned allocation and creates no event."""

    def __init__(self, max_rows: int, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.buffers = (
            [torch.empty(max_rows, dtype=torch.long, pin_memory=True) for _ in range(2)]
            if self.on_cuda
            else []
        )
        self.events = [torch.cuda.Event() for _ in range(2)] if self.on_cuda else []
        self.turn = 0

    def queue(
        self, rows: list[RowT], tokens: torch.Tensor, clock_turn: int | None
    ) -> InFlight[RowT]:
        row_of = {id(seq): i for i, seq in enumerate(rows)}
        if not self.on_cuda:
            return InFlight(rows, tokens, tokens, None, row_of, clock_turn)
        self.turn ^= 1
        host = self.buffers[self.turn][: tokens.shape[0]]
        host.copy_(tokens, non_blocking=True)
        ready = self.events[self.turn]
        ready.record()
        return InFlight(rows, tokens, host, ready, row_of, clock_turn)


class DeviceClock:
    """Timing events around each decode step's device work (its inputs, the step, the
    token choice), so the host can tell how long the device worked on a step and how
    long it sat idle since the step before it: what separates a host-bound server from
    a device-bound one (`/metrics`, `EngineMetrics.observe_device_step`).

    Pairs of events are used in turn, `PAIRS` of them, so that a step's end event is
    still unrecorded-over when the step after it is read (two steps run ahead at most).
    An idle gap is counted only between two decode steps with nothing else queued
    between them (`interrupt`: a prefill was). No events on CPU.
    """

    PAIRS = 4

    def __init__(self, device: torch.device, make_event: Callable[[], Any] | None = None):
        on = device.type == "cuda" or make_event is not None
        make = make_event or (lambda: torch.cuda.Event(enable_timing=True))
        self.pairs = [(make(), make()) for _ in range(self.PAIRS)] if on else []
        self.turn = 0
        self.follows = [False] * self.PAIRS  # the step came right after the one before
        self.last_read: int | None = None
        self._interrupted = True

    def start(self) -> int | None:
        if not self.pairs:
            return None
        self.turn = (self.turn + 1) % self.PAIRS
        self.follows[self.turn] = not self._interrupted
        self._interrupted = False
        self.pairs[self.turn][0].record()
        return self.turn

    def stop(self, turn: int | None) -> None:
        if turn is not None and self.pairs:
            self.pairs[turn][1].record()

    def interrupt(self) -> None:
        """Other device work was queued: the next step's idle gap is not a decode gap."""
        self._interrupted = True

    def read(self, turn: int | None, metrics: EngineMetrics) -> None:
        """Hand the step's times to `metrics` (waiting for its stop event, which the
        token readback has normally waited for already)."""
        if turn is None or not self.pairs:
            return
        start, stop = self.pairs[turn]
        try:
            stop.synchronize()
            idle_s = None
            previous = (turn - 1) % self.PAIRS
            if self.follows[turn] and self.last_read == previous:
                idle_s = self.pairs[previous][1].elapsed_time(start) / 1e3
            busy_s = start.elapsed_time(stop) / 1e3
        except RuntimeError:
            # A measurement must never fail the requests it measures: stop measuring.
            log.exception("device step timing failed; /metrics will not time decode steps")
            self.pairs = []
            return
        metrics.observe_device_step(busy_s, idle_s)
        self.last_read = turn
