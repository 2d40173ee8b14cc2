"""What the server says about itself: its Prometheus `/metrics`, read during each job.

This module owns the names: one table maps each engine's documented metric names (vLLM V1
and its older spellings, SGLang with `--enable-metrics`, llama.cpp with `--metrics`, our
PyTorch engine) to one vocabulary (`SERVER_FIELDS`), so nothing downstream knows which
engine it reads. Pages are parsed with `prometheus_client`'s parser; series of one name are
summed over their labels (ranks, engines), except acceptance per draft position, which is
kept per position.

`ServerMetricsPoller` reads the page every `interval_s` (0.5 s) on its own thread, and
once more when stopped, hands each reading to a sink (telemetry rows) and keeps the
latest; `polling` is how every job (probe, sweep, eval; campaign or standalone) runs one,
its rows tagged with the job's id. A server without the endpoint, or one that stops
answering, costs one log line, no failure. Counter deltas between two readings (`delta`)
give a cell's prefix-cache hits and a drafter's acceptance.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from contract.results import CellResult, ServerCounters
from contract.suite import PromptCalibration
from contract.telemetry import SERVER_METRICS_FILE

__all__ = [
    "SERVER_FIELDS",
    "SERVER_METRICS_FILE",
    "ServerMetricsCsv",
    "ServerMetricsPoller",
    "ServerReading",
    "annotate_cell",
    "delta",
    "parse_metrics",
    "polling",
    "with_response_drafts",
]

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
_TIMEOUT_S = 2.0
_MAX_PAGE_BYTES = 8 * 1024 * 1024

# Canonical field -> the sample names engines publish for it (first found wins).
SERVER_FIELDS: dict[str, tuple[str, ...]] = {
    "requests_running": (
        "vllm:num_requests_running",
        "sglang:num_running_reqs",
        "llamacpp:requests_processing",
        "pytorch_engine_requests_running",
    ),
    "requests_waiting": (
        "vllm:num_requests_waiting",
        "sglang:num_queue_reqs",
        "llamacpp:requests_deferred",
        "pytorch_engine_requests_waiting",
    ),
    # Fraction 0..1 of the KV cache in use.
    "kv_cache_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "llamacpp:kv_cache_usage_ratio",
    ),
    "preemptions": ("vllm:num_preemptions_total",),
    # Prompt tokens looked up in, and found in, the prefix cache.
    "prefix_cache_queries": (
        "vllm:prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries_total",
        "sglang:prompt_tokens_total",
    ),
    "prefix_cache_hits": (
        "vllm:prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits_total",
        "sglang:cached_tokens_total",
    ),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total",),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    # A gauge: mean tokens accepted per verification step, where only that is published.
    "spec_accept_length": ("sglang:spec_accept_length",),
}
_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_COUNTERS = (
    "preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
)


@dataclass(frozen=True, slots=True)
class ServerReading:
    """One page, in the canonical vocabulary; absent fields are not published there."""

    time_unix_s: float
    time_perf_ns: int
    values: dict[str, float] = field(default_factory=dict)
    accepted_per_position: dict[int, float] = field(default_factory=dict)


def parse_metrics(text: str, *, time_unix_s: float = 0.0, time_perf_ns: int = 0) -> ServerReading:
    """Parse a Prometheus text page; raises ValueError when it is not one."""
    sums: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == _PER_POSITION:
                position = int(sample.labels.get("position", "-1"))
                per_position[position] = per_position.get(position, 0.0) + sample.value
            else:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    values: dict[str, float] = {}
    for name, candidates in SERVER_FIELDS.items():
        found = next((sums[c] for c in candidates if c in sums), None)
        if found is not None:
            values[name] = found
    return ServerReading(time_unix_s, time_perf_ns, values, dict(sorted(per_position.items())))


def delta(before: ServerReading | None, after: ServerReading | None) -> ServerCounters | None:
    """What the server counted between two readings (None when either is missing)."""
    if before is None or after is None:
        return None
    moved: dict[str, float | None] = {}
    for name in _COUNTERS:
        if name in before.values and name in after.values:
            # A counter that went down was reset (server restart): the span is unknown.
            diff = after.values[name] - before.values[name]
            moved[name] = diff if diff >= 0 else None
        else:
            moved[name] = None
    per_position = {
        pos: after.accepted_per_position[pos] - before.accepted_per_position.get(pos, 0.0)
        for pos in after.accepted_per_position
    }
    drafted, accepted = moved["spec_draft_tokens"], moved["spec_accepted_tokens"]
    drafts = moved["spec_drafts"]
    return ServerCounters(
        seconds=(after.time_perf_ns - before.time_perf_ns) / 1e9,
        preemptions=moved["preemptions"],
        prefix_cache_queries=moved["prefix_cache_queries"],
        prefix_cache_hits=moved["prefix_cache_hits"],
        spec_drafts=drafts,
        spec_draft_tokens=drafted,
        spec_accepted_tokens=accepted,
        spec_acceptance_rate=accepted / drafted if drafted and accepted is not None else None,
        spec_acceptance_rate_per_position=[
            per_position[pos] / drafts for pos in sorted(per_position)
        ]
        if drafts
        else [],
        spec_accept_length=after.values.get("spec_accept_length"),
    )


# Share of prompt tokens the prefix cache may serve beyond the chat template's head before a
# cell is flagged (block rounding and the odd shared nonce word stay under it).
_PREFIX_SLACK = 0.02


def annotate_cell(
    cell: CellResult,
    before: ServerReading | None,
    after: ServerReading | None,
    calibration: PromptCalibration | None,
) -> CellResult:
    """The cell with the server's counters over it, flagged when its prefix cache hit more
    prompt than every request's shared chat-template head can explain."""
    counters = delta(before, after)
    if counters is None:
        return cell
    update: dict[str, object] = {"server": counters}
    queries, hits = counters.prefix_cache_queries, counters.prefix_cache_hits
    if queries and hits is not None and cell.input_tokens:
        head = calibration.template_overhead_tokens if calibration else 0
        allowed = min(1.0, head / cell.input_tokens) + _PREFIX_SLACK
        share = hits / queries
        if share > allowed:
            why = (
                f"prefix cache served {share:.1%} of prompt tokens, more than the chat "
                f"template's head ({head} tokens) explains: prompts were not unique from their "
                "first token, so TTFT is understated"
            )
            update["prefix_cache_suspect"] = True
            update["reason"] = f"{cell.reason}; {why}" if cell.reason else why
    return cell.model_copy(update=update)


def with_response_drafts(cell: CellResult) -> CellResult:
    """The cell with its drafter's counts taken from the responses themselves (llama.cpp's
    per-response `timings`), where the server's /metrics counted no drafts."""
    windows = [w for w in cell.repeats if w.draft_tokens is not None]
    if not windows or (cell.server is not None and cell.server.spec_draft_tokens is not None):
        return cell
    drafted = float(sum(w.draft_tokens or 0 for w in windows))
    accepted = float(sum(w.draft_accepted_tokens or 0 for w in windows))
    server = cell.server or ServerCounters(seconds=sum(w.duration_s for w in windows))
    counts = {
        "spec_draft_tokens": drafted,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / drafted if drafted else None,
    }
    return cell.model_copy(update={"server": server.model_copy(update=counts)})


Sink = Callable[[ServerReading], None]
SERVER_COLUMNS = ("time_unix_s", "time_perf_ns", "job_id", "source", *SERVER_FIELDS)


class ServerMetricsCsv:
    """A sink writing one row per reading, tagged `source=server` and with the job running.

    Its own file beside `telemetry.csv` (the telemetry sampler owns that one's writer).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.job_id: str | None = None
        new = not path.exists()
        self._handle = path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._handle, fieldnames=SERVER_COLUMNS)
        if new:
            self._writer.writeheader()

    def __call__(self, reading: ServerReading) -> None:
        row: dict[str, object] = {
            "time_unix_s": f"{reading.time_unix_s:.3f}",
            "time_perf_ns": reading.time_perf_ns,
            "job_id": self.job_id or "",
            "source": "server",
        }
        row.update({k: f"{v:g}" for k, v in reading.values.items()})
        self._writer.writerow(row)
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


class ServerMetricsPoller:
    """Reads `base_url/metrics` every `interval_s` on a daemon thread until `stop()`."""

    def __init__(
        self,
        base_url: str,
        *,
        sink: Sink | None = None,
        interval_s: float = POLL_INTERVAL_S,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self._sink = sink
        self._headers = headers or {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._latest: ServerReading | None = None
        self._thread = threading.Thread(target=self._run, name="server-metrics", daemon=True)
        self.readings = 0
        self.failures = 0
        self.cpu_s = 0.0
        self._warned = False

    def __enter__(self) -> ServerMetricsPoller:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def latest(self) -> ServerReading | None:
        with self._lock:
            return self._latest

    def read_now(self) -> ServerReading | None:
        """One reading right away (a cell boundary), from the caller's thread."""
        with httpx.Client(timeout=_TIMEOUT_S, headers=self._headers, trust_env=False) as http:
            return self._read(http)

    def _read(self, http: httpx.Client) -> ServerReading | None:
        try:
            response = http.get(self.url)
            if response.status_code != 200 or len(response.content) > _MAX_PAGE_BYTES:
                raise ValueError(f"HTTP {response.status_code}")
            reading = parse_metrics(
                response.text, time_unix_s=time.time(), time_perf_ns=time.perf_counter_ns()
            )
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            if not self._warned:
                self._warned = True
                log.debug("server metrics: %s gave none (%s); going on without", self.url, exc)
            return None
        with self._lock:
            self._latest = reading
        self.readings += 1
        return reading

    def _run(self) -> None:
        cpu0 = time.thread_time()
        with httpx.Client(timeout=_TIMEOUT_S, headers=self._headers, trust_env=False) as http:
            next_at = time.perf_counter()
            while not self._stop.is_set():
                self._take(http)
                self.cpu_s = time.thread_time() - cpu0
                next_at += self.interval_s
                self._stop.wait(max(0.0, next_at - time.perf_counter()))
                if time.perf_counter() > next_at + self.interval_s:
                    next_at = time.perf_counter()  # fell behind: skip, do not burst
            # The server at the job's end: a job shorter than the thread's start (a
            # one-request probe on a busy host) still has a reading.
            self._take(http)
            self.cpu_s = time.thread_time() - cpu0

    def _take(self, http: httpx.Client) -> None:
        reading = self._read(http)
        if reading is not None and self._sink is not None:
            try:
                self._sink(reading)
            except Exception:  # a sink's failure must never end the run
                log.debug("server metrics: sink failed", exc_info=True)


@contextlib.contextmanager
def polling(
    base_url: str, path: Path, job_id: str, *, headers: dict[str, str] | None = None
) -> Iterator[ServerMetricsPoller]:
    """Poll `base_url/metrics` for the block, appending rows tagged `job_id` to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ServerMetricsCsv(path)
    rows.job_id = job_id
    try:
        with ServerMetricsPoller(base_url, sink=rows, headers=headers) as poller:
            yield poller
    finally:
        rows.close()
