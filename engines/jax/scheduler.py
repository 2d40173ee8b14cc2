"""Continuous batching over fixed slots for the JAX engine, on a dedicated thread.

The same contract as the PyTorch engine's scheduler (`engines.serving.server.BatchScheduler`):
`submit`/`abort` from the HTTP layer, one `StepOutput` per generated token through
`deliver`. One iteration: take new requests and aborts; prefill waiting prompts into free
slots, chunk by chunk, at most `prefill_budget` prompt tokens per iteration (a prompt's
chunks depend only on the prompt, so its numbers never depend on the load); then one
decode step over every slot, which running requests join and leave between steps. When
every running request is greedy and one of them still has `runner.steps` tokens to go,
that decode call runs `runner.steps` steps on the device (`JaxRunner.decode_greedy`) and
its tokens are accepted in order, a finished request's surplus dropped: requests join and
leave between calls, and stream in groups of up to that many tokens. While no request
waits to join and every row is still running, the next call is queued before the one in
flight is read (run-ahead: `_decode_greedy`), so the host's cost of a call overlaps the
device's work; a row that finishes in the call in flight has its queued tokens dropped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import cast

import jax
import numpy as np

from engines.jax.runner import BANNED_PER_ROW, JaxRunner, PendingSteps, sample_host
from engines.serving.batching import BatchLoop
from engines.serving.detokenizer import TextStream
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import Deliver, GenerationRequest

log = logging.getLogger(__name__)

MAX_CALLS_AHEAD = 1024  # calls queued ahead in one run at most (each re-checks the inbox)


@dataclass
class _Sequence:
    request: GenerationRequest
    handle: object
    stream: TextStream
    rng: np.random.Generator
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0
    done: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)


class JaxScheduler(BatchLoop[_Sequence]):
    """The batching loop and the state of every request in it (the thread, inbox, outbox
    and how a request ends: the shared `engines.serving.batching.BatchLoop`)."""

    def __init__(
        self,
        runner: JaxRunner,
        *,
        metrics: EngineMetrics,
        deliver: Deliver,
        prefill_budget: int = 2048,
    ) -> None:
        super().__init__(
            metrics=metrics,
            deliver=deliver,
            max_model_len=runner.max_len,
            thread_name="jax-scheduler",
        )
        self.runner = runner
        self.tokenizer = runner.loaded.tokenizer
        self.eos = tuple(runner.loaded.eos_token_ids)
        self.prefill_budget = max(prefill_budget, runner.chunk)
        self._free = list(range(runner.num_slots))

    # -- the scheduler thread ---------------------------------------------------------

    def _run(self) -> None:
        log.info("scheduler started: %d slots", self.runner.num_slots)
        with jax.default_device(self.runner.loaded.device):
            while not self._stop.is_set():
                try:
                    self._iteration()
                except Exception:
                    log.exception("scheduler iteration failed; failing the requests in flight")
                    for seq in [*self._running, *self._waiting]:
                        self._finish_error(seq, "internal error in the engine's scheduler")
                finally:
                    self._flush()
        log.info("scheduler stopped")

    def _iteration(self) -> None:
        self._take_inbox(block=not self._running and not self._waiting)
        if self._waiting:
            self._prefill_waiting()
        if self._running:
            self._decode_step()
        self.metrics.set_queues(len(self._running), len(self._waiting))

    def _add(self, request: GenerationRequest, handle: object) -> None:
        params = request.params
        seed = params.seed
        rng = np.random.default_rng(None if seed is None else seed % 2**64)
        eos = () if params.ignore_eos else self.eos
        stream = TextStream(
            self.tokenizer,
            stop=params.stop,
            include_stop=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
        )
        seq = _Sequence(request, handle, stream, rng, frozenset((*eos, *params.stop_token_ids)))
        self._by_id[request.request_id] = seq
        self._waiting.append(seq)

    def _banned(self, seq: _Sequence) -> list[int]:
        return seq.request.params.banned_ids(len(seq.output_ids), self.eos, seq.stop_ids)

    def _prefill_waiting(self) -> None:
        spent = 0
        while self._waiting and spent < self.prefill_budget:
            seq = self._waiting[0]
            if seq.slot is None:
                if not self._free:
                    return
                seq.slot = self._free.pop(0)
            prompt = seq.request.prompt_ids
            n = min(self.runner.chunk, seq.prompt_len - seq.prefilled)
            t0 = time.perf_counter()
            try:
                logits = self.runner.prefill(
                    seq.slot, prompt[seq.prefilled : seq.prefilled + n], seq.prefilled
                )
                seq.prefilled += n
                if seq.prefilled < seq.prompt_len:
                    spent += n
                    continue
                row = np.asarray(logits)
            except Exception as e:
                log.exception("prefill failed for %s", seq.request.request_id)
                self._finish_error(seq, f"prefill failed: {e}")
                continue
            finally:
                self.metrics.observe_step("prefill", time.perf_counter() - t0, 1, 0)
            spent += n
            self.metrics.add_prompt_tokens(seq.prompt_len)
            self._waiting.popleft()
            self._running.append(seq)
            self._accept(seq, self._choose(seq, row))

    def _choose(self, seq: _Sequence, row: np.ndarray) -> int:
        return sample_host(row, seq.request.params, self._banned(seq), seq.rng)

    def _greedy_bans(self, seq: _Sequence) -> tuple[list[int], list[int], int] | None:
        """A row's bans for `decode_greedy` (after `min_tokens`, before it, and its steps
        left before it), or None where its tokens must be chosen on the host."""
        params = seq.request.params
        n = len(seq.output_ids)
        always = params.banned_ids(max(n, params.min_tokens), self.eos, seq.stop_ids)
        until = self._banned(seq)
        if not params.greedy or len(until) > BANNED_PER_ROW:
            return None
        return always, until, params.min_tokens - n

    def _tokens_left(self, seq: _Sequence) -> int:
        n = len(seq.output_ids)
        return min(seq.request.params.max_tokens - n, self.max_model_len - seq.prompt_len - n)

    def _decode_step(self) -> None:
        rows = list(self._running)
        if self.runner.steps > 1 and max(map(self._tokens_left, rows)) >= self.runner.steps:
            greedy_bans = [self._greedy_bans(seq) for seq in rows]
            ready = [b for b in greedy_bans if b is not None]
            if len(ready) == len(rows):
                self._decode_greedy(rows, ready)
                return
        slots: list[int] = []
        for seq in rows:
            assert seq.slot is not None  # running sequences hold a slot
            slots.append(seq.slot)
        tokens = [seq.output_ids[-1] for seq in rows]
        positions = [seq.prompt_len + len(seq.output_ids) - 1 for seq in rows]
        bans = [self._banned(seq) for seq in rows]
        t0 = time.perf_counter()
        try:
            logits, greedy = self.runner.decode(slots, tokens, positions, bans)
        except Exception as e:
            log.exception("decode step failed")
            for seq in rows:
                self._finish_error(seq, f"decode failed: {e}")
            return
        for row, seq in enumerate(rows):
            if seq.request.params.greedy and len(bans[row]) <= BANNED_PER_ROW:
                token = int(greedy[row])
            else:
                token = self._choose(seq, np.asarray(logits[row]))
            self._accept(seq, token)
        self.metrics.observe_step("decode", time.perf_counter() - t0, len(rows), len(rows))

    def _decode_greedy(
        self, rows: list[_Sequence], bans: list[tuple[list[int], list[int], int]]
    ) -> None:
        """Calls of `runner.steps` greedy steps for these rows, each queued before the
        one in flight is read while nothing else waits (see `_may_run_ahead`): the
        host's cost of a call then overlaps the device's work, not adds to it."""
        steps = self.runner.steps
        slots = [cast(int, seq.slot) for seq in rows]  # running sequences hold a slot
        positions = [seq.prompt_len + len(seq.output_ids) - 1 for seq in rows]
        always = [b[0] for b in bans]
        until = [b[1] for b in bans]
        left = [b[2] for b in bans]
        fed: list[int] | jax.Array = [seq.output_ids[-1] for seq in rows]
        pending: PendingSteps | None = None
        t0 = time.perf_counter()
        for call in range(MAX_CALLS_AHEAD + 1):
            try:
                ahead = None
                if pending is not None:
                    self._between_calls()
                if pending is None or (call < MAX_CALLS_AHEAD and self._may_run_ahead(rows)):
                    ahead = self.runner.start_greedy(slots, fed, positions, always, until, left)
                out = pending.tokens() if pending is not None else None
            except Exception as e:
                log.exception("decode steps failed")
                for seq in rows:
                    self._finish_error(seq, f"decode failed: {e}")
                return
            if out is not None:
                t0 = self._accept_steps(rows, out, t0)
            if ahead is None:
                return
            pending, fed = ahead, ahead.last
            positions = [p + steps for p in positions]
            left = [n - steps for n in left]

    def _between_calls(self) -> None:
        """Hand out what is queued, take new requests and aborts, and report the queues:
        a run of queued calls can be a whole request long."""
        self._flush()
        self._take_inbox(block=False)
        self.metrics.set_queues(len(self._running), len(self._waiting))

    def _may_run_ahead(self, rows: list[_Sequence]) -> bool:
        """Whether to queue another call for the same rows before the one in flight is
        read: only while every row is still running and no request waits to join (a new
        one waits for the call in flight and this one), and while some row has a call's
        worth of tokens left after the one in flight."""
        if self._waiting or any(seq.done for seq in rows):
            return False
        steps = self.runner.steps
        return max(self._tokens_left(seq) for seq in rows) - steps >= steps

    def _accept_steps(self, rows: list[_Sequence], out: np.ndarray, t0: float) -> float:
        """Hand out a call's tokens [steps, rows] in order, a finished row's surplus
        dropped; returns the time they were read."""
        now = time.perf_counter()
        step_s = (now - t0) / len(out)
        for step in out:
            live = [(seq, int(token)) for seq, token in zip(rows, step, strict=True)]
            live = [(seq, token) for seq, token in live if not seq.done]
            for seq, token in live:
                self._accept(seq, token)
            if live:
                self.metrics.observe_step("decode", step_s, len(live), len(live))
        return now

    def _accept(self, seq: _Sequence, token: int) -> None:
        params = seq.request.params
        try:
            seq.output_ids.append(token)
            n = len(seq.output_ids)
            text = seq.stream.add(token, check_stop=n >= params.min_tokens)
        except Exception as e:
            log.exception("detokenizing failed for %s", seq.request.request_id)
            self._finish_error(seq, f"detokenizing failed: {e}")
            return
        self._hand_out(seq, token, text, seq.stop_ids)

    def _give_back_slot(self, seq: _Sequence) -> None:
        if seq.slot is not None:
            self._free.append(seq.slot)
            self._free.sort()
            seq.slot = None
