"""What both engines' continuous-batching schedulers share, whatever runs the model.

`BatchLoop` is the part of a scheduler (`engines.serving.server.BatchScheduler`) that does
not depend on the model: the scheduler thread and its start/stop, the inbox that `submit`
and `abort` fill from the HTTP side (any thread), the requests in the batch (`_waiting`,
`_running`, by id), how a request ends after a token (a stop id, a stop string, the length
cap, an error), and the outbox: every `StepOutput` of one iteration is queued with
`_emit` and handed over at once by `_flush` through `deliver`, whose failure is logged
rather than allowed to stop the loop.

An engine's scheduler subclasses it with its own sequence type and supplies `_run` (the
loop around its iteration), `_add` (a new request into `_waiting`) and `_give_back_slot`
(its KV slot, when a request leaves).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Generic, Protocol, TypeVar, cast

from engines.serving.detokenizer import TextStream
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import Deliver, GenerationRequest, StepOutput

__all__ = ["IDLE_POLL_S", "BatchLoop", "BatchedSequence"]

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.1  # how long an idle scheduler waits on its inbox before looking again


class BatchedSequence(Protocol):
    """What `BatchLoop` reads and writes of an engine's per-request state."""

    request: GenerationRequest
    handle: object
    stream: TextStream
    output_ids: list[int]
    done: bool

    @property
    def prompt_len(self) -> int: ...


SeqT = TypeVar("SeqT", bound=BatchedSequence)


class BatchLoop(Generic[SeqT]):
    """The model-independent half of a scheduler; see the module docstring."""

    def __init__(
        self, *, metrics: EngineMetrics, deliver: Deliver, max_model_len: int, thread_name: str
    ) -> None:
        self.metrics = metrics
        self.deliver = deliver
        self.max_model_len = max_model_len
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._waiting: deque[SeqT] = deque()
        self._running: list[SeqT] = []
        self._by_id: dict[str, SeqT] = {}
        self._outbox: list[tuple[object, StepOutput]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    # -- the HTTP side (any thread) -------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, request: GenerationRequest, handle: object) -> None:
        """Queue a request; its outputs are delivered with `handle`."""
        self._inbox.put(("submit", (request, handle)))

    def abort(self, request_id: str) -> None:
        """Drop a request (its client went away); nothing more is delivered for it."""
        self._inbox.put(("abort", request_id))

    # -- what an engine's scheduler supplies -------------------------------------------

    def _run(self) -> None:
        raise NotImplementedError

    def _add(self, request: GenerationRequest, handle: object) -> None:
        raise NotImplementedError

    def _give_back_slot(self, seq: SeqT) -> None:
        raise NotImplementedError

    # -- the scheduler thread ---------------------------------------------------------

    def _take_inbox(self, block: bool) -> None:
        """Everything queued since the last look; waits `IDLE_POLL_S` for it when `block`."""
        try:
            kind, item = self._inbox.get(timeout=IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if kind == "submit":
                request, handle = cast(tuple[GenerationRequest, object], item)
                self._add(request, handle)
            elif kind == "abort":
                seq = self._by_id.get(str(item))
                if seq is not None and not seq.done:
                    self._release(seq)
                    self.metrics.request_finished("abort")
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _hand_out(self, seq: SeqT, token: int, text: str, stop_ids: frozenset[int]) -> None:
        """Queue the output of `token` (already appended, `text` its new text), ending the
        request when the token is a stop id, the text hit a stop string, or it is at its
        length cap (its own `max_tokens`, or the model's length)."""
        params = seq.request.params
        n = len(seq.output_ids)
        finish: str | None = None
        stop_reason: str | int | None = None
        if token in stop_ids and n >= params.min_tokens:
            finish = "stop"
            stop_reason = token if token in params.stop_token_ids else None
        elif seq.stream.stopped_by is not None:
            finish, stop_reason = "stop", seq.stream.stopped_by
        elif n >= params.max_tokens or seq.prompt_len + n >= self.max_model_len:
            finish = "length"
        if finish is not None:
            text += seq.stream.finish()
            self._release(seq)
            self.metrics.request_finished(finish)
        self._emit(seq.handle, StepOutput(text, (token,), seq.prompt_len, n, finish, stop_reason))

    def _finish_error(self, seq: SeqT, message: str) -> None:
        """End a request with an error output (once: a request already ended stays so)."""
        if seq.done:
            return
        self._release(seq)
        self.metrics.request_finished("error")
        self._emit(
            seq.handle,
            StepOutput("", (), seq.prompt_len, len(seq.output_ids), "error", error=message),
        )

    def _release(self, seq: SeqT) -> None:
        """Take a request out of the batch and give its slot back."""
        seq.done = True
        self._by_id.pop(seq.request.request_id, None)
        self._give_back_slot(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        if seq in self._running:
            self._running.remove(seq)

    def _emit(self, handle: object, output: StepOutput) -> None:
        self._outbox.append((handle, output))

    def _flush(self) -> None:
        """Hand every queued output over at once; a failed hand-over is logged, not raised."""
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self.deliver(batch)
        except Exception:
            log.exception("delivering %d outputs failed", len(batch))
