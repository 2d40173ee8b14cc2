"""The load sweep: every shape at every concurrency level, repeated, cell by cell.

`burst` (the seeds' numbers): N requests released at once, the window ends with the last.
`steady`: N workers keep N requests in flight; a warm-up period is discarded and requests
that finish inside the measured window count. `rate`: open-loop arrivals at each request
rate (agent/loadgen/arrivals.py), one cell per rate. Each cell is `ok`, `infeasible` (it cannot
run on this server, with why), `partial` (it measured, but some request of a measured window
failed: its figures are shown with the loss and never ranked) or `failed` (it broke, with the
error); none is dropped. An unmeasured call that fails after its retries (tokenize while
prompts are built, the server gone) fails the cell in progress and the sweep moves on.
Records are appended as each window ends and the summary written once calibrated (no cells
yet, so a sweep stopped in its first cell can be resumed) and rewritten after each cell.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypedDict

from agent.jobfolder import JobFolder
from agent.loadgen.arrivals import arrival_stats, run_rate_window
from agent.loadgen.client import ChatRequest, OpenAIClient, ServerCallError, ServerInfo
from agent.loadgen.prompts import Prompt, PromptFactory, calibrate
from agent.loadgen.text_sources import TextSource, calibrate_source, load_source
from agent.loadgen.vllm_export import vllm_bench_serve_run
from agent.telemetry.server_metrics import (
    ServerMetricsPoller,
    ServerReading,
    annotate_cell,
    delta,
    with_response_drafts,
)
from contract import metrics
from contract.results import (
    EXPORT_LABEL_PREFIX,
    CellResult,
    CellStatus,
    RequestRecord,
    SweepSummary,
    WindowStats,
    cell_label,
    window_label,
)
from contract.suite import PromptCalibration, Shape, SweepMode, SweepSettings

__all__ = ["count_requests", "run_sweep"]

log = logging.getLogger(__name__)

ProgressHook = Callable[[int], None]
_MAX_STEADY_PROMPTS = 200_000

# Phrases servers use when a prompt plus its output cannot fit the context (vLLM, SGLang,
# llama.cpp, OpenAI). A cell whose every request fails with one of these is infeasible.
_CONTEXT_ERRORS = (
    "context length",
    "context window",
    "maximum context",
    "exceeds the available context",
    "exceed_context_size",
    "too long",
    "max_model_len",
    "context size",
)


def count_requests(settings: SweepSettings) -> int:
    """Requests a burst sweep sends (for progress bars): warm-up included."""
    windows = settings.repeats + (1 if settings.warmup else 0)
    return sum(level * windows for level in settings.levels) * len(settings.shapes)


def _is_context_error(error: str | None) -> bool:
    return error is not None and any(phrase in error.lower() for phrase in _CONTEXT_ERRORS)


class _CellKey(TypedDict):
    """What names a cell: the fields every CellResult of it shares."""

    shape: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    mode: SweepMode
    request_rate: float | None


class _CellRunner:
    def __init__(
        self,
        client: OpenAIClient,
        settings: SweepSettings,
        prompts: PromptFactory,
        writer: JobFolder,
        info: ServerInfo,
        progress: ProgressHook | None,
        server_metrics: ServerMetricsPoller | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.prompts = prompts
        self.writer = writer
        self.info = info
        self.progress = progress
        self.server_metrics = server_metrics

    def _requests(
        self, prompts: list[Prompt], shape: Shape, label: str, phase: str
    ) -> list[ChatRequest]:
        return [
            ChatRequest(
                prompt=p.text,
                max_tokens=shape.output_tokens,
                label=label,
                request_id=f"{label}/{i}",
                phase=phase,
                input_tokens_target=shape.input_tokens,
            )
            for i, p in enumerate(prompts)
        ]

    def _record(self, records: list[RequestRecord]) -> None:
        self.writer.append_requests(records)

    async def _burst(self, requests: list[ChatRequest]) -> list[RequestRecord]:
        async def one(request: ChatRequest, dispatch_ns: int) -> RequestRecord:
            record = await self.client.send(request, dispatch_ns=dispatch_ns)
            if self.progress:
                self.progress(1)
            return record

        dispatch = time.perf_counter_ns()
        return list(await asyncio.gather(*(one(r, dispatch) for r in requests)))

    async def _steady(
        self, shape: Shape, level: int, label: str
    ) -> tuple[list[RequestRecord], tuple[int, int]]:
        s = self.settings
        # Prompts are built before the window opens: tokenize calls inside it would starve
        # the workers. One unmeasured request sizes the pool from its latency.
        (sizing,) = await self.prompts.build(1, shape.input_tokens)
        probe = await self.client.send(
            ChatRequest(
                prompt=sizing.text,
                max_tokens=shape.output_tokens,
                label=label,
                request_id=f"{label}/sizing",
                phase="warmup",
                input_tokens_target=shape.input_tokens,
            )
        )
        latency_s = max((metrics.latency_ms(probe) or 1000.0) / 1000.0, 0.001)
        horizon_s = s.steady_warmup_s + s.steady_window_s
        needed = min(_MAX_STEADY_PROMPTS, int(level * (horizon_s / latency_s * 1.25 + 2)))
        pool: list[Prompt] = await self.prompts.build(needed, shape.input_tokens)
        records: list[RequestRecord] = [probe]
        start = time.perf_counter_ns()
        window = (
            start + int(s.steady_warmup_s * 1e9),
            start + int(horizon_s * 1e9),
        )

        async def worker(worker_id: int) -> None:
            sent = 0
            while time.perf_counter_ns() < window[1]:
                if not pool:
                    log.warning("%s: steady prompt pool ran out; building more in-window", label)
                    try:
                        pool.extend(await self.prompts.build(level * 2, shape.input_tokens))
                    except ServerCallError as exc:
                        stopped.append(exc)  # the window is broken: the cell stops after it
                        return
                prompt = pool.pop()
                phase = "warmup" if time.perf_counter_ns() < window[0] else "measured"
                request = ChatRequest(
                    prompt=prompt.text,
                    max_tokens=shape.output_tokens,
                    label=label,
                    request_id=f"{label}/w{worker_id}/{sent}",
                    phase=phase,
                    input_tokens_target=shape.input_tokens,
                )
                records.append(await self.client.send(request))
                sent += 1
                if self.progress:
                    self.progress(1)

        stopped: list[ServerCallError] = []
        await asyncio.gather(*(worker(i) for i in range(level)))
        if stopped:
            self._record(records)  # kept on disk; the window is not counted
            raise stopped[0]
        return records, window

    async def run_cell(self, shape: Shape, level: int, rate: float | None = None) -> CellResult:
        s = self.settings
        base = _CellKey(
            shape=shape.name,
            input_tokens=shape.input_tokens,
            output_tokens=shape.output_tokens,
            concurrency=level,
            mode=s.mode,
            request_rate=rate,
        )
        needed = shape.input_tokens + shape.output_tokens
        if self.info.max_context_tokens and needed > self.info.max_context_tokens:
            reason = (
                f"{shape.input_tokens} in + {shape.output_tokens} out = {needed} tokens exceeds "
                f"the server's context of {self.info.max_context_tokens} per request"
            )
            return CellResult(**base, status="infeasible", reason=reason)
        windows: list[WindowStats] = []
        all_errors: list[str | None] = []
        try:
            early = await self._measure(shape, level, rate, base, windows, all_errors)
        except ServerCallError as exc:
            log.warning("%s c=%d: %s", shape.name, level, exc)
            return _cell_from_windows(base, windows, all_errors, aborted=str(exc))
        if early is not None:
            return early
        cell = _cell_from_windows(base, windows, all_errors)
        saturated = [w.arrivals for w in windows if w.arrivals and w.arrivals.over_saturated]
        if saturated:
            why = f"over-saturated in {len(saturated)} of {len(windows)} windows: "
            why += saturated[0].over_saturation_reason or ""
            reason = f"{cell.reason}; {why}" if cell.reason else why
            cell = cell.model_copy(update={"over_saturated": True, "reason": reason})
        return cell

    async def _measure(
        self,
        shape: Shape,
        level: int,
        rate: float | None,
        base: _CellKey,
        windows: list[WindowStats],
        all_errors: list[str | None],
    ) -> CellResult | None:
        """Fill `windows` repeat by repeat; a CellResult only when the cell is infeasible."""
        s = self.settings
        await self.client.warm(level)
        deadline = time.monotonic() + s.max_cell_s
        cell = cell_label(shape.name, level, rate)
        # A rate window opens with its own warm-up seconds, so it needs no warm-up window.
        first_repeat = -1 if s.warmup and rate is None else 0
        for repeat in range(first_repeat, s.repeats):
            if time.monotonic() > deadline:
                log.warning(
                    "%s c=%d: cell time limit reached after %d repeats",
                    shape.name,
                    level,
                    len(windows),
                )
                break
            label = window_label(cell, repeat)
            phase = "warmup" if repeat < 0 else "measured"
            # The server's counters around each measured window, for the drafter's acceptance
            # in the export (a rate window's include its own warm-up seconds).
            before = await _server_reading(self.server_metrics) if repeat >= 0 else None
            if s.mode == "burst":
                prompts = await self.prompts.build(level, shape.input_tokens)
                records = await self._burst(self._requests(prompts, shape, label, phase))
                window_ns = None
            elif rate is not None:
                records, rate_window = await run_rate_window(
                    self.client,
                    self.prompts,
                    s,
                    shape,
                    rate,
                    label,
                    seed=f"{s.seed}/{shape.name}/{rate}/{repeat}",
                    progress=self.progress,
                )
                window_ns = None
            else:
                records, window_ns = await self._steady(shape, level, label)
            self._record(records)
            failed = [r.error or "no output tokens" for r in records if not r.ok]
            all_errors.extend(failed)
            for error in dict.fromkeys(failed):
                log.warning("%s: %d failed: %s", label, failed.count(error), error)
            if repeat < 0:
                if records and all(_is_context_error(r.error) for r in records):
                    return CellResult(**base, status="infeasible", reason=records[0].error)
                continue
            stats = metrics.window_stats(
                [r for r in records if r.phase == "measured"] if rate is not None else records,
                repeat=repeat,
                mode=s.mode,
                concurrency=level,
                window_ns=window_ns,
                slo_ttft_ms=s.slo_ttft_ms,
                slo_tpot_ms=s.slo_tpot_ms,
                slo_e2el_ms=s.slo_e2el_ms,
            )
            if rate is not None:
                offered = arrival_stats(records, rate_window, rate=rate, settings=s)
                stats = stats.model_copy(update={"arrivals": offered})
            windows.append(stats)
            after = await _server_reading(self.server_metrics)
            self.writer.append_vllm_export(
                vllm_bench_serve_run(
                    [r for r in records if r.phase == "measured"],
                    stats,
                    model=self.info.model,
                    endpoint=self.client.settings.endpoint,
                    label=EXPORT_LABEL_PREFIX + cell,
                    date=datetime.now(UTC),
                    server=delta(before, after),
                )
            )
        return None


def _cell_from_windows(
    base: _CellKey,
    windows: list[WindowStats],
    errors: list[str | None],
    *,
    aborted: str | None = None,
) -> CellResult:
    """The cell's status: `ok` only when every measured window is complete and none is missing."""
    measured = [w for w in windows if w.aggregate_output_tok_s is not None]
    status: CellStatus = "ok"
    reason = None
    lost = sum(w.requests_failed for w in windows)
    if not measured:
        if aborted is None and errors and all(_is_context_error(e) for e in errors):
            status, reason = "infeasible", errors[0]
        else:
            status = "failed"
            reason = aborted or next((e for e in errors if e), "no window completed")
    elif lost or aborted or len(measured) < len(windows):
        status = "partial"
        first = next((e for e in errors if e), None)
        parts = [f"{lost} request(s) failed" + (f": {first}" if first and lost else "")]
        if aborted:
            parts.append(f"stopped after {len(windows)} window(s): {aborted}")
        reason = "; ".join(p for p in parts if not p.startswith("0 request"))
    rates = sorted(w.aggregate_output_tok_s for w in measured if w.aggregate_output_tok_s)
    return CellResult(
        **base,
        status=status,
        reason=reason,
        repeats=windows,
        aggregate_output_tok_s_median=metrics.median(rates),
        aggregate_output_tok_s_min=rates[0] if rates else None,
        aggregate_output_tok_s_max=rates[-1] if rates else None,
        ttft_ms_p50_median=metrics.median(w.ttft_ms.p50 for w in measured if w.ttft_ms.p50),
        tpot_ms_p50_median=metrics.median(w.tpot_ms.p50 for w in measured if w.tpot_ms.p50),
    )


def _counts(cells: list[CellResult]) -> dict[str, int]:
    return {
        "measured": sum(1 for c in cells if c.status == "ok"),
        "partial": sum(1 for c in cells if c.status == "partial"),
        "failed": sum(1 for c in cells if c.status == "failed"),
        "infeasible": sum(1 for c in cells if c.status == "infeasible"),
    }


async def _server_reading(poller: ServerMetricsPoller | None) -> ServerReading | None:
    return await asyncio.to_thread(poller.read_now) if poller is not None else None


async def run_sweep(
    client: OpenAIClient,
    settings: SweepSettings,
    writer: JobFolder,
    *,
    progress: ProgressHook | None = None,
    on_cell: Callable[[CellResult], None] | None = None,
    prompt_factory: Callable[[PromptCalibration], PromptFactory] | None = None,
    source: TextSource | None = None,
    server_metrics: ServerMetricsPoller | None = None,
    previous: SweepSummary | None = None,
) -> SweepSummary:
    """Run every cell; the summary on disk is complete after each one.

    `prompt_factory` replaces how prompts are made (tests use it to mix in faults).
    `source` is the text of `settings.prompts`, when the caller loaded it already.
    `server_metrics` reads the server's /metrics at each cell's ends (counters, prefix check).
    `previous` resumes an interrupted sweep of the same settings: its cells are kept and
    skipped, its calibration reused so every prompt is built the same way.
    """
    if source is None and settings.prompts != "synthetic":
        source = load_source(settings.prompts)
    info = await client.server_info()
    started = previous.started_unix_s if previous else time.time()
    anchor_unix, anchor_ns = time.time(), time.perf_counter_ns()
    calibration = previous.calibration if previous else None
    calibration = calibration or await calibrate_source(client, await calibrate(client), source)
    log.info(
        "prompt calibration: tokenize=%s overhead=%d tokens/word=%.3f",
        calibration.tokenize_endpoint,
        calibration.template_overhead_tokens,
        calibration.tokens_per_word,
    )
    factory = (
        prompt_factory(calibration)
        if prompt_factory
        else PromptFactory(calibration, client.tokenize_raw, source=source)
    )
    runner = _CellRunner(client, settings, factory, writer, info, progress, server_metrics)
    cells: list[CellResult] = list(previous.cells) if previous else []
    done = {(c.shape, c.concurrency, c.request_rate) for c in cells}

    def summary(finished: bool) -> SweepSummary:
        return SweepSummary(
            base_url=client.base_url,
            model=info.model,
            endpoint=client.settings.endpoint,
            started_unix_s=started,
            finished_unix_s=time.time() if finished else None,
            wall_anchor_unix_s=anchor_unix,
            wall_anchor_ns=anchor_ns,
            settings=settings,
            calibration=calibration,
            cells=cells,
            counts=_counts(cells),
        )

    writer.write_summary(summary(finished=False))  # settings on disk: resumable from here
    points: list[tuple[int, float | None]] = (
        [(settings.max_concurrency or 0, rate) for rate in settings.rates]
        if settings.mode == "rate"
        else [(level, None) for level in settings.levels]
    )
    for shape in settings.shapes:
        for level, rate in points:
            if (shape.name, level, rate) in done:
                log.info("%s c=%d: done in the earlier run; skipped", shape.name, level)
                continue
            before = await _server_reading(server_metrics)
            cell = await runner.run_cell(shape, level, rate)
            if server_metrics is not None:
                after = await _server_reading(server_metrics)
                cell = annotate_cell(cell, before, after, calibration)
            cell = with_response_drafts(cell)
            cells.append(cell)
            writer.write_summary(summary(finished=False))
            if cell.status != "ok":
                log.warning("%s c=%d: %s (%s)", shape.name, level, cell.status, cell.reason)
            if on_cell:
                on_cell(cell)
    final = summary(finished=True)
    writer.write_summary(final)
    return final
