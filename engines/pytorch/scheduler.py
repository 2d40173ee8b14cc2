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

The thread, the inbox, the outbox and how a request ends are shared with the JAX engine
(`engines.serving.batching.BatchLoop`); the device-side token readback and step timing are
`engines.pytorch.device_steps`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from engines.pytorch.device_steps import DeviceClock, InFlight, TokenReadback
from engines.pytorch.profiling import DecodeProfiler
from engines.pytorch.runner import ModelRunner
from engines.pytorch.sampling import (
    SamplerState,
    choose_token,
    choose_tokens,
    greedy_token_tensor,
)
from engines.serving.batching import BatchLoop
from engines.serving.detokenizer import TextStream
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import Deliver as Deliver
from engines.serving.requests import GenerationRequest as GenerationRequest
from engines.serving.requests import StepOutput as StepOutput

log = logging.getLogger(__name__)


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


class Scheduler(BatchLoop[_Sequence]):
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
        super().__init__(
            metrics=metrics,
            deliver=deliver,
            max_model_len=runner.loaded.max_model_len,
            thread_name="engine-scheduler",
        )
        self.runner = runner
        self.tokenizer = runner.loaded.tokenizer
        self.eos_token_ids = runner.loaded.eos_token_ids
        self.max_running = max_running
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = max(prefill_budget, prefill_chunk)
        self._free_slots = set(range(max_running))
        self._compact = bool(getattr(runner, "requires_compact_slots", False))
        self._packed = bool(getattr(runner, "packed_prefill", False))
        # Asynchronous decode needs the batched step (its tokens go straight back in).
        self._async = async_decode and self._compact
        self._inflight: InFlight | None = None
        self._readback = TokenReadback(max_running, runner.device) if self._async else None
        self._clock = DeviceClock(runner.device)
        self._profiler = profiler

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

    def _take_tokens(self, step: InFlight) -> None:
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
        self._hand_out(seq, token, text, seq.sampler.stop_ids)

    def _give_back_slot(self, seq: _Sequence) -> None:
        if seq.slot is not None:
            self._clock.interrupt()
            self.runner.clear_slot(seq.slot)
            self._free_slots.add(seq.slot)
            seq.slot = None
