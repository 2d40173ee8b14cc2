"""Continuous batching on a dedicated thread: requests join the running batch between
decode steps, leave when they finish, and fail alone.

The scheduler thread owns the model runner, the KV slots and every request's state; the
HTTP layer talks to it only through `submit`/`abort` (thread-safe) and receives
`StepOutput` records through a `deliver` callback that it makes safe for its event loop.
So the event loop never waits on the model, and streams keep flowing while it runs.

One iteration: take new requests and aborts; prefill waiting requests while slots are
free (each prompt in fixed-size chunks, at most `prefill_budget` tokens per iteration,
so a long prompt delays the running batch by one chunk, not by the whole prompt); then
one decode step for every running request; then hand all outputs over at once.
Prefill chunking depends only on the prompt, never on what else is waiting, so a
request computes the same numbers whatever the load (see `runner` on batch invariance).

With a runner that decodes in batched form (the CUDA path, `runner.requires_compact_slots`)
the running sequences are kept in the lowest slots, 0 ... n - 1: free slots are handed out
lowest first, and before a decode step a running sequence above n swaps places with the
hole below n (whatever holds the hole, a prefilling sequence or nothing, moves up). With
a runner that packs prefill (`runner.packed_prefill`), one forward takes the next chunk of
each of several waiting prompts, up to the budget.

With `async_decode` (batched runners, greedy rows) a decode step is queued on the device,
fed with the previous step's tokens where they lie, before the host reads those tokens:
the host's per-token work (detokenizing, stop checks, streaming) then overlaps the next
step instead of sitting between two (`_decode_step_async`).

Every request gets exactly one `StepOutput` per generated token (the last one also
carries the finish reason), so a client that counts chunks counts tokens.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from engines.pytorch.profiling import DecodeProfiler
from engines.pytorch.runner import ModelRunner
from engines.pytorch.sampling import (
    SamplerState,
    choose_token,
    choose_tokens,
    greedy_token_tensor,
)
from engines.serving.detokenizer import TextStream
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import Deliver as Deliver
from engines.serving.requests import GenerationRequest as GenerationRequest
from engines.serving.requests import StepOutput as StepOutput

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.1


@dataclass
class _Sequence:
    request: GenerationRequest
    handle: object
    sampler: SamplerState
    stream: TextStream
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    done: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)


@dataclass
class _InFlight:
    """A decode step queued on the device whose tokens the host has not read yet."""

    rows: list[_Sequence]
    tokens: torch.Tensor  # (rows,) on the device: fed to the next step as they are
    host: torch.Tensor  # (rows,) their copy on the host (pinned on CUDA)
    ready: torch.cuda.Event | None  # recorded after that copy; None: already there
    row_of: dict[int, int] = field(default_factory=dict)  # id(seq) -> row
    clock_turn: int | None = None  # its `_DeviceClock` events

    def wait(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()  # releases the GIL while the device works
        return self.host.tolist()


class _TokenReadback:
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
        self, rows: list[_Sequence], tokens: torch.Tensor, clock_turn: int | None
    ) -> _InFlight:
        row_of = {id(seq): i for i, seq in enumerate(rows)}
        if not self.on_cuda:
            return _InFlight(rows, tokens, tokens, None, row_of, clock_turn)
        self.turn ^= 1
        host = self.buffers[self.turn][: tokens.shape[0]]
        host.copy_(tokens, non_blocking=True)
        ready = self.events[self.turn]
        ready.record()
        return _InFlight(rows, tokens, host, ready, row_of, clock_turn)


class _DeviceClock:
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


class Scheduler:
    """The batching loop and the state of every request in it."""

    def __init__(
        self,
        runner: ModelRunner,
        *,
        max_running: int,
        metrics: EngineMetrics,
        deliver: Deliver,
        prefill_chunk: int = 512,
        prefill_budget: int = 2048,
        async_decode: bool = False,
        profiler: DecodeProfiler | None = None,
    ) -> None:
        self.runner = runner
        self.tokenizer = runner.loaded.tokenizer
        self.eos_token_ids = runner.loaded.eos_token_ids
        self.max_model_len = runner.loaded.max_model_len
        self.max_running = max_running
        self.metrics = metrics
        self.deliver = deliver
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = max(prefill_budget, prefill_chunk)
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._by_id: dict[str, _Sequence] = {}
        self._free_slots = set(range(max_running))
        self._compact = bool(getattr(runner, "requires_compact_slots", False))
        self._packed = bool(getattr(runner, "packed_prefill", False))
        self._outbox: list[tuple[object, StepOutput]] = []
        # Asynchronous decode needs the batched step (its tokens go straight back in).
        self._async = async_decode and self._compact
        self._inflight: _InFlight | None = None
        self._readback = _TokenReadback(max_running, runner.device) if self._async else None
        self._clock = _DeviceClock(runner.device)
        self._profiler = profiler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)

    # -- the HTTP side (any thread) -------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
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

    # -- the scheduler thread ---------------------------------------------------------

    def _run(self) -> None:
        log.info("scheduler started: %d slots", self.max_running)
        while not self._stop.is_set():
            try:
                self._iteration()
            except Exception:
                # A bug outside the per-request guards: fail what is in flight rather
                # than leave clients hanging, and keep serving.
                log.exception("scheduler iteration failed; failing the requests in flight")
                for seq in [*self._running, *self._waiting]:
                    self._finish_error(seq, "internal error in the engine's scheduler")
                self._running.clear()
                self._waiting.clear()
                self._inflight = None
            finally:
                self._flush()
        log.info(
            "scheduler stopped (%d decode steps queued ahead of their inputs)",
            self.metrics.decode_steps_queued_ahead,
        )

    def _iteration(self) -> None:
        idle = not self._running and not self._waiting
        self._take_inbox(block=idle)
        if self._waiting:
            self._prefill_waiting()
        if self._running:
            self._decode_step()
        self.metrics.set_queues(len(self._running), len(self._waiting))
        self.metrics.set_kv_cache_bytes(self.runner.cache.nbytes())

    def _take_inbox(self, block: bool) -> None:
        try:
            kind, item = self._inbox.get(timeout=IDLE_POLL_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(kind, item)
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, item: object) -> None:
        if kind == "submit":
            request, handle = cast(tuple[GenerationRequest, object], item)
            self._add(request, handle)
        elif kind == "abort":
            seq = self._by_id.get(str(item))
            if seq is not None and not seq.done:
                self._release(seq)
                self.metrics.request_finished("abort")

    def _add(self, request: GenerationRequest, handle: object) -> None:
        params = request.params
        try:
            sampler = SamplerState.create(params, self.eos_token_ids, self.runner.device)
        except Exception as e:  # e.g. a seed the generator refuses
            self._emit(
                handle, StepOutput("", (), len(request.prompt_ids), 0, "error", error=str(e))
            )
            return
        stream = TextStream(
            self.tokenizer,
            stop=params.stop,
            include_stop=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
        )
        seq = _Sequence(request=request, handle=handle, sampler=sampler, stream=stream)
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def _take_slot(self) -> int | None:
        """The lowest free slot (low slots keep compaction cheap), or None."""
        if not self._free_slots:
            return None
        slot = min(self._free_slots)
        self._free_slots.remove(slot)
        return slot

    def _prefill_waiting(self) -> None:
        self._clock.interrupt()
        if self._packed:
            self._prefill_packed()
            return
        budget = self.prefill_budget
        spent = 0
        while self._waiting and not self._stop.is_set():
            seq = self._waiting[0]
            if seq.slot is None:
                seq.slot = self._take_slot()
                if seq.slot is None:
                    return
            chunk = min(self.prefill_chunk, seq.prompt_len - seq.prefilled)
            if spent and spent + chunk > budget:
                return
            spent += chunk
            start = seq.prefilled
            ids = list(seq.request.prompt_ids[start : start + chunk])
            t0 = time.perf_counter()
            try:
                logits = self.runner.prefill(seq.slot, ids, start)
            except Exception as e:
                log.exception("prefill failed for %s", seq.request.request_id)
                self._waiting.popleft()
                self._finish_error(seq, f"prefill failed: {e}")
                continue
            self._prefilled(seq, chunk, logits, time.perf_counter() - t0)

    def _prefilled(self, seq: _Sequence, chunk: int, logits: torch.Tensor, seconds: float) -> None:
        """Book a prefilled chunk; a finished prompt starts running with its first token."""
        seq.prefilled += chunk
        self.metrics.add_prompt_tokens(chunk)
        if seq.prefilled < seq.prompt_len:
            self.metrics.observe_step("prefill", seconds, 1, 0)
            return
        self._waiting.remove(seq)
        self._running.append(seq)
        self._accept(seq, logits)
        self.metrics.observe_step("prefill", seconds, 1, 1)
        # The first token goes out now, not after the other prefills and the decode
        # step of this iteration: time to first token is this request's own prefill.
        self._flush()

    def _prefill_packed(self) -> None:
        """One forward over the next chunk of each waiting prompt that fits the budget."""
        plan: list[tuple[_Sequence, int]] = []
        spent = 0
        for seq in self._waiting:
            if seq.slot is None:
                seq.slot = self._take_slot()
                if seq.slot is None:
                    break
            chunk = min(self.prefill_chunk, seq.prompt_len - seq.prefilled)
            if spent and spent + chunk > self.prefill_budget:
                break
            spent += chunk
            plan.append((seq, chunk))
        if not plan:
            return
        chunks = [
            (
                seq.slot,
                list(seq.request.prompt_ids[seq.prefilled : seq.prefilled + chunk]),
                seq.prefilled,
            )
            for seq, chunk in plan
        ]
        t0 = time.perf_counter()
        try:
            # Ignored below: every planned sequence holds a slot (Sequence.slot is None only while
            # waiting).
            logits = self.runner.prefill_many(chunks)  # type: ignore[arg-type]
        except Exception:
            # Which prompt broke the pack is unknown: redo them one by one, so only
            # that one fails.
            log.exception("packed prefill of %d chunks failed; retrying one by one", len(plan))
            for seq, chunk in plan:
                t0 = time.perf_counter()
                try:
                    row = self.runner.prefill(
                        # Ignored below: as above: a planned sequence holds a slot.
                        seq.slot,  # type: ignore[arg-type]
                        list(seq.request.prompt_ids[seq.prefilled : seq.prefilled + chunk]),
                        seq.prefilled,
                    )
                except Exception as e:
                    log.exception("prefill failed for %s", seq.request.request_id)
                    self._finish_error(seq, f"prefill failed: {e}")
                    continue
                self._prefilled(seq, chunk, row, time.perf_counter() - t0)
            return
        seconds = (time.perf_counter() - t0) / len(plan)
        for (seq, chunk), row in zip(plan, logits, strict=True):
            self._prefilled(seq, chunk, row, seconds)

    def _compact_slots(self) -> None:
        """Move running sequences into slots 0 ... n - 1 (see the module docstring)."""
        n = len(self._running)
        used = {seq.slot for seq in self._running}
        holes = [slot for slot in range(n) if slot not in used]
        if not holes:
            return
        self._clock.interrupt()
        movers = sorted(
            (seq for seq in self._running if seq.slot is not None and seq.slot >= n),
            # Ignored below: filtered to sequences with a slot just above.
            key=lambda seq: seq.slot,  # type: ignore[arg-type,return-value]
        )
        holders = {seq.slot: seq for seq in self._waiting if seq.slot is not None}
        for seq, hole in zip(movers, holes, strict=True):
            old = seq.slot
            assert old is not None
            self.runner.swap_slots(old, hole)
            holder = holders.get(hole)
            if holder is not None:
                holder.slot = old
            else:
                self._free_slots.discard(hole)
                self._free_slots.add(old)
            seq.slot = hole
        # Ignored below: running sequences hold slots.
        self._running.sort(key=lambda seq: seq.slot)  # type: ignore[arg-type,return-value]

    def _decode_step(self) -> None:
        if self._profiler is not None:
            self._profiler.before_step()
        if self._compact:
            self._compact_slots()
        if self._async:
            self._decode_step_async()
        else:
            self._decode_step_sync()
        if self._profiler is not None:
            self._profiler.after_step()

    def _decode_step_sync(self) -> None:
        """One step: decode every running row, then choose and hand out its tokens."""
        rows = list(self._running)
        t0 = time.perf_counter()
        turn = self._clock.start()
        try:
            logits = self._decode(rows)
            self._clock.stop(turn)
        except Exception:
            log.exception("batched decode of %d rows failed; retrying rows one by one", len(rows))
            logits = None
        if logits is None:
            self._clock.interrupt()
            for seq in rows:
                try:
                    self._accept(seq, self._decode([seq])[0])
                except Exception as e:
                    log.exception("decode failed for %s", seq.request.request_id)
                    self._finish_error(seq, f"decode failed: {e}")
        else:
            try:
                tokens = choose_tokens(
                    logits, [s.sampler for s in rows], [len(s.output_ids) for s in rows]
                )
            except Exception:
                log.exception("batched token choice failed; choosing row by row")
                tokens = [None] * len(rows)
            self._clock.read(turn, self.metrics)
            for seq, row, token in zip(rows, logits, tokens, strict=True):
                self._accept(seq, row, token)
        self._running = [s for s in self._running if not s.done]
        self.metrics.observe_step("decode", time.perf_counter() - t0, len(rows), len(rows))

    def _decode_step_async(self) -> None:
        """Queue step n + 1 on the device, fed with step n's tokens where they lie, and
        only then read step n's tokens and do its host work (detokenize, stop checks,
        streaming) while step n + 1 runs: the host no longer sits between two steps.

        Step n + 1 is queued before step n's results are known, so a row that step n
        finishes gets one token too many; it is dropped unread, and its K/V write lands
        in a slot that is free by then (stale positions are masked for the slot's next
        owner). Sampled rows are not run ahead: for them, and whenever the batch changed
        (a request joined), the in-flight step is read first and the next iteration
        queues from the host's tokens.
        """
        rows = list(self._running)
        prev = self._inflight
        ahead = prev is not None and all(
            id(seq) in prev.row_of and self._may_run_ahead(seq) for seq in rows
        )
        if prev is not None and not ahead:
            self._inflight = None
            self._take_tokens(prev)
            return
        if any(not seq.sampler.params.greedy for seq in rows):
            self._decode_step_sync()
            return
        t0 = time.perf_counter()
        if prev is not None:  # the tokens of step n, still on the device
            taken = [prev.row_of[id(seq)] for seq in rows]
            tokens: list[int] | torch.Tensor = prev.tokens
            if taken != list(range(len(prev.rows))):
                tokens = prev.tokens[torch.tensor(taken, device=prev.tokens.device)]
            behind = 1
            self.metrics.decode_step_queued_ahead()
        else:
            tokens = [seq.output_ids[-1] for seq in rows]
            behind = 0
        turn = self._clock.start()
        try:
            logits = self.runner.decode(
                # Ignored below: running sequences hold slots.
                [seq.slot for seq in rows],  # type: ignore[misc]
                tokens,
                [seq.prompt_len + len(seq.output_ids) - 1 + behind for seq in rows],
            )
            chosen = greedy_token_tensor(
                logits, [s.sampler for s in rows], [len(s.output_ids) + behind for s in rows]
            )
            self._clock.stop(turn)  # before the readback's event, so it is done by then
            assert self._readback is not None
            self._inflight = self._readback.queue(rows, chosen, turn)
        except Exception:
            log.exception("asynchronous decode of %d rows failed", len(rows))
            self._clock.interrupt()
            self._inflight = None
            if prev is not None:
                self._take_tokens(prev)  # rows may have finished: compact again
                self._compact_slots()
            self._decode_step_sync()
            return
        if prev is not None:
            self._take_tokens(prev)
        self.metrics.observe_step("decode", time.perf_counter() - t0, len(rows), len(rows))

    def _may_run_ahead(self, seq: _Sequence) -> bool:
        """May the step after the in-flight one be queued for `seq` before its token is
        read? Greedy rows only (a sampled row draws on the host), and not past the end
        of the cache. A row that the in-flight token ends (by length, EOS or a stop
        string) still runs once more: its extra token is dropped unread, which keeps the
        batch in slots 0 ... n - 1 and the device busy."""
        next_position = seq.prompt_len + len(seq.output_ids)  # of the in-flight token
        return seq.sampler.params.greedy and next_position < self.max_model_len - 1

    def _take_tokens(self, step: _InFlight) -> None:
        """Read an in-flight step's tokens and hand them to their (still running) rows."""
        tokens = step.wait()
        self._clock.read(step.clock_turn, self.metrics)
        for seq, token in zip(step.rows, tokens, strict=True):
            if not seq.done:
                # Ignored below: the token is the sequence's next id; no logits row to pass.
                self._accept(seq, None, token)  # type: ignore[arg-type]
        self._running = [s for s in self._running if not s.done]

    def _decode(self, rows: list[_Sequence]) -> torch.Tensor:
        slots = [s.slot for s in rows]
        tokens = [s.output_ids[-1] for s in rows]
        positions = [s.prompt_len + len(s.output_ids) - 1 for s in rows]
        # Ignored below: running sequences hold slots.
        return self.runner.decode(slots, tokens, positions)  # type: ignore[arg-type]

    def _accept(self, seq: _Sequence, logits: torch.Tensor, token: int | None = None) -> None:
        """Choose the sequence's next token from its logits (unless `choose_tokens` already
        did), stream it, maybe finish it."""
        params = seq.request.params
        try:
            if token is None:
                token = choose_token(logits, seq.sampler, len(seq.output_ids))
            seq.output_ids.append(token)
            n = len(seq.output_ids)
            text = seq.stream.add(token, check_stop=n >= params.min_tokens)
        except Exception as e:
            log.exception("sampling failed for %s", seq.request.request_id)
            self._finish_error(seq, f"sampling failed: {e}")
            return
        finish: str | None = None
        stop_reason: str | int | None = None
        if token in seq.sampler.stop_ids and n >= params.min_tokens:
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
        self._emit(
            seq.handle,
            StepOutput(
                text=text,
                token_ids=(token,),
                prompt_tokens=seq.prompt_len,
                completion_tokens=n,
                finish_reason=finish,
                stop_reason=stop_reason,
            ),
        )

    def _finish_error(self, seq: _Sequence, message: str) -> None:
        if seq.done:
            return
        self._release(seq)
        self.metrics.request_finished("error")
        self._emit(
            seq.handle,
            StepOutput("", (), seq.prompt_len, len(seq.output_ids), "error", error=message),
        )

    def _release(self, seq: _Sequence) -> None:
        """Take a sequence out of every queue and give its slot back."""
        seq.done = True
        self._by_id.pop(seq.request.request_id, None)
        if seq.slot is not None:
            self._clock.interrupt()
            self.runner.clear_slot(seq.slot)
            self._free_slots.add(seq.slot)
            seq.slot = None
        if seq in self._waiting:
            self._waiting.remove(seq)
        if seq in self._running:
            self._running.remove(seq)

    def _emit(self, handle: object, output: StepOutput) -> None:
        self._outbox.append((handle, output))

    def _flush(self) -> None:
        if not self._outbox:
            return
        batch, self._outbox = self._outbox, []
        try:
            self.deliver(batch)
        except Exception:
            log.exception("delivering %d outputs failed", len(batch))
