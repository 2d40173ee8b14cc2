"""What a tool run produced: per-request records and the run's figures (`ToolRun`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract.metrics import percentile

ToolName = Literal["aiperf", "guidellm"]

#: Pinned versions: the issue compares against exactly these releases.
TOOL_VERSIONS: dict[str, str] = {"aiperf": "0.13.0", "guidellm": "0.8.1"}

#: Bumped when the tokenizer folder's content changes, so stale copies are rewritten.
_TOKENIZER_NAME = "tokenizer-bytes-v1"

#: How often the CPU sampler reads the tool's process tree (seconds).
_CPU_SAMPLE_S = 0.2


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One request as the tool exported it; times are wall clock (epoch seconds).

    Both tools stamp request start/end with the wall clock (AIPerf ``time.time_ns()``,
    guidellm ``time.time()``), so records from either tool share one time base;
    `ToolRun.epoch_minus_mono_s` converts to the monotonic clock the reference server logs.
    """

    ok: bool
    start_s: float
    end_s: float
    ttft_ms: float | None = None
    output_tokens: int | None = None
    #: The tool's per-request ITL (see `ToolRun.itl_definition`).
    itl_ms: float | None = None
    #: Arrival times (epoch s) of every content chunk, when the tool exports them
    #: (AIPerf: start + TTFT + cumulative inter-chunk gaps; guidellm: not exported).
    chunk_times_s: list[float] | None = None
    #: Time of the first and last token-bearing chunk (guidellm exports these two only).
    first_token_s: float | None = None
    last_token_s: float | None = None
    error: str | None = None
    #: The X-Request-ID header the tool sent (AIPerf does; the reference server logs it as
    #: ``request_id``), for matching records to the server's ground truth.
    x_request_id: str | None = None
    #: The ``id`` of the server's response chunks (guidellm keeps it; the reference server
    #: logs it as ``id``), the other way to match.
    response_id: str | None = None


@dataclass
class ToolRun:
    """What one tool run reported, where it came from, and what it cost.

    ``output_tok_s``, ``ttft_*``, ``itl_*`` and ``requests_*`` are copied from the tool's own
    summary file, untouched (sources on `run_aiperf` / `run_guidellm`); ``records`` are its
    per-request export; ``cpu_*`` and ``wall_s`` are measured here around the subprocess.
    """

    tool: str
    version: str
    argv: list[str]
    #: Environment variables set (value) or removed (None) for the tool process.
    env_changes: dict[str, str | None]
    returncode: int
    out_dir: Path
    concurrency: int
    output_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_definition: str = ""
    requests_ok: int = 0
    requests_failed: int = 0
    #: guidellm only: requests cut off by the end of the run (neither ok nor errored).
    requests_incomplete: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    #: user+sys CPU seconds of the whole process tree, start to exit (startup included),
    #: from getrusage(RUSAGE_CHILDREN) deltas.
    cpu_s: float = 0.0
    cpu_user_s: float = 0.0
    cpu_sys_s: float = 0.0
    #: CPU seconds of the process tree between the first request's start and the last
    #: request's end, interpolated from psutil samples every 0.2 s (startup excluded).
    cpu_window_s: float | None = None
    wall_s: float = 0.0
    #: time.time() - time.perf_counter() taken just before launch: epoch -> monotonic.
    epoch_minus_mono_s: float = 0.0
    #: Further figures the tool reports, by name (its own achieved concurrency etc.).
    extra: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    log_path: Path | None = None

    def ok_records(self) -> list[RequestRecord]:
        """The successful requests."""
        return [r for r in self.records if r.ok]

    def ttfts_ms(self) -> list[float]:
        """Per-request TTFT (ms) of the successful requests, in the tool's own definition."""
        return [r.ttft_ms for r in self.ok_records() if r.ttft_ms is not None]

    def window(self) -> tuple[float, float] | None:
        """The load window (epoch s): first request start to last request start.

        After the last start the closed loop drains by design, so in-flight averages over
        the full span would charge the tool for the tail every tool has.
        """
        if not self.records:
            return None
        starts = [r.start_s for r in self.records]
        return min(starts), max(starts)

    def achieved_concurrency(self, window: tuple[float, float] | None = None) -> float | None:
        """Time-weighted mean of requests in flight (start..end) over ``window``.

        Default window: `window` (first start .. last start). Every exported request counts,
        failed ones too, since they occupied a slot while in flight.
        """
        win = window or self.window()
        if win is None or win[1] <= win[0]:
            return None
        a, b = win
        busy = sum(max(0.0, min(r.end_s, b) - max(r.start_s, a)) for r in self.records)
        return busy / (b - a)

    def span_s(self) -> float | None:
        """First request start to last request end (s), from the records."""
        if not self.records:
            return None
        return max(r.end_s for r in self.records) - min(r.start_s for r in self.records)

    def cpu_s_per_mtok(self, *, window: bool = False) -> float | None:
        """Client CPU seconds per million output tokens (successful requests).

        ``window=True`` uses `cpu_window_s` (startup excluded) instead of `cpu_s`.
        """
        tokens = sum(r.output_tokens or 0 for r in self.ok_records())
        cpu = self.cpu_window_s if window else self.cpu_s
        if not tokens or cpu is None:
            return None
        return cpu / tokens * 1e6

    def to_mono_ns(self, epoch_s: float) -> int:
        """Convert a record time to perf_counter_ns (the reference server's clock)."""
        return int((epoch_s - self.epoch_minus_mono_s) * 1e9)

    def summary(self) -> dict[str, Any]:
        """A flat dict for tables and JSON (records left out)."""
        ttfts = self.ttfts_ms()
        return {
            "tool": f"{self.tool} {self.version}",
            "concurrency": self.concurrency,
            "returncode": self.returncode,
            "ok": self.requests_ok,
            "failed": self.requests_failed,
            "incomplete": self.requests_incomplete,
            "records_ok": len(self.ok_records()),
            "records_failed": len(self.records) - len(self.ok_records()),
            "reported_output_tok_s": self.output_tok_s,
            "reported_ttft_p50_ms": self.ttft_p50_ms,
            "reported_ttft_p99_ms": self.ttft_p99_ms,
            "reported_itl_p50_ms": self.itl_p50_ms,
            "reported_itl_p99_ms": self.itl_p99_ms,
            "records_ttft_p50_ms": percentile(sorted(ttfts), 50) if ttfts else None,
            "records_ttft_p99_ms": percentile(sorted(ttfts), 99) if ttfts else None,
            "achieved_concurrency": self.achieved_concurrency(),
            "cpu_s": self.cpu_s,
            "cpu_window_s": self.cpu_window_s,
            "cpu_s_per_mtok": self.cpu_s_per_mtok(),
            "cpu_window_s_per_mtok": self.cpu_s_per_mtok(window=True),
            "wall_s": self.wall_s,
            "span_s": self.span_s(),
            **{f"tool_{k}": v for k, v in self.extra.items()},
        }
