"""Result records: what the agent writes per request, per cell and per job, and what reports read.

Every time stamp is an integer from `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux), so
deltas are exact and comparable across processes of one host. A run also records one
(`wall_anchor_unix_s`, `wall_anchor_ns`) pair so samples taken by other clocks (telemetry)
can be placed on the same axis. Durations are derived later, in `contract.metrics`; nothing
here computes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import Field

from contract.frozen import FrozenModel
from contract.suite import ProbeSettings, PromptCalibration, SweepMode, SweepSettings

__all__ = [
    "DONE_FILE",
    "EXPORT_LABEL_PREFIX",
    "REQUESTS_FILE",
    "SUMMARY_FILE",
    "VLLM_EXPORT_FILE",
    "ArrivalStats",
    "CellResult",
    "CellStatus",
    "ChunkTokenSource",
    "Distribution",
    "ForcedOutput",
    "ProbePrompt",
    "ProbeSummary",
    "RequestRecord",
    "ServerCounters",
    "SweepSummary",
    "WindowStats",
    "cell_label",
    "in_cells",
    "window_label",
]

# Files of one job folder (results/<campaign>/jobs/<job>/), as docs/DESIGN.md lays them out.
REQUESTS_FILE = "requests.jsonl"
SUMMARY_FILE = "summary.json"
VLLM_EXPORT_FILE = "vllm_bench_serve.jsonl"
DONE_FILE = "done"

# A cell is `ok` only when every request of every measured window completed; `partial` when it
# measured but lost requests (its figures are not comparable and never ranked).
CellStatus = Literal["ok", "partial", "infeasible", "failed"]
ForcedOutput = Literal["ignore_eos", "min_tokens"]
ChunkTokenSource = Literal["continuous_usage", "one_per_chunk", "proportional_to_text", "none"]


# A vLLM-format export line (VLLM_EXPORT_FILE) carries its cell's label after this prefix.
EXPORT_LABEL_PREFIX = "bench:"


def cell_label(shape: str, concurrency: int, request_rate: float | None) -> str:
    """What a cell's request labels start with: `in512-out128/c8`, or `in512-out128/rate2`
    in rate mode. Its windows add `/r<repeat>` (or `/warmup`); its export lines carry it
    after EXPORT_LABEL_PREFIX. Written once, so a resume and a report find a cell's lines by
    the same key the summary's cells use: (shape, concurrency, request_rate).
    """
    point = f"c{concurrency}" if request_rate is None else f"rate{request_rate:g}"
    return f"{shape}/{point}"


def window_label(cell: str, repeat: int) -> str:
    """The label of the requests of window `repeat` of cell `cell`; -1 is the warm-up."""
    return f"{cell}/" + ("warmup" if repeat < 0 else f"r{repeat}")


def in_cells(label: str, cells: Collection[str]) -> bool:
    """Whether a request line or an export line labelled `label` belongs to one of `cells`
    (cell labels, as cell_label makes them).
    """
    label = label.removeprefix(EXPORT_LABEL_PREFIX)
    return label in cells or label.rpartition("/")[0] in cells


class _Record(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


class RequestRecord(_Record):
    """One request as the client saw it: one line of `requests.jsonl`.

    A request that failed carries `error` (and `http_status` where there was one); it is
    data, never an exception. Times are perf_counter ns; `None` means the event never came.
    """

    request_id: str
    label: str = Field(description="where it belongs, e.g. 'in512-out128/c8/r2' or 'probe/p3/r1'")
    phase: Literal["warmup", "measured"] = "measured"
    endpoint: Literal["chat", "completions"]
    scheduled_ns: int | None = Field(
        None, description="rate mode: when the arrival process said the request was due"
    )
    released_ns: int | None = Field(
        None, description="rate mode: when the scheduler woke to release it"
    )
    dispatch_ns: int = Field(description="when the load loop released the request")
    send_ns: int = Field(description="just before the request bytes were written")
    first_chunk_ns: int | None = Field(None, description="first SSE event of any kind")
    first_token_ns: int | None = Field(
        None, description="first event carrying content or reasoning content"
    )
    first_content_ns: int | None = Field(None, description="first event carrying content")
    last_token_ns: int | None = Field(None, description="last event carrying content/reasoning")
    end_ns: int | None = Field(None, description="stream end: [DONE] or end of body")
    chunk_ns: list[int] = Field(
        default_factory=list, description="arrival of every content/reasoning event"
    )
    chunk_tokens: list[int] = Field(
        default_factory=list, description="tokens in each of those events (see source)"
    )
    chunk_tokens_source: ChunkTokenSource = "none"
    content_chunks: int = 0
    reasoning_chunks: int = 0
    content_chars: int = 0
    reasoning_chars: int = 0
    prompt_tokens: int | None = Field(None, description="usage.prompt_tokens")
    completion_tokens: int | None = Field(None, description="usage.completion_tokens")
    reasoning_tokens: int | None = None
    cached_prompt_tokens: int | None = Field(
        None, description="usage.prompt_tokens_details.cached_tokens: prefix-cache hits"
    )
    draft_tokens: int | None = Field(
        None, description="tokens the drafter proposed for this response (llama.cpp draft_n)"
    )
    draft_accepted_tokens: int | None = Field(
        None, description="of those, accepted by the target (llama.cpp draft_n_accepted)"
    )
    input_tokens_target: int | None = None
    output_tokens_target: int | None = None
    forced_output: list[ForcedOutput] = Field(default_factory=list)
    usage_chunk_mismatch: int | None = Field(
        None, description="usage.completion_tokens - content+reasoning events, when both known"
    )
    finish_reason: str | None = None
    text_sha256: str | None = None
    text: str | None = Field(None, description="kept for the probe's repeat check only")
    http_status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.output_tokens)

    @property
    def output_tokens(self) -> int:
        """usage.completion_tokens where the server sent it, else the count of token events."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return sum(self.chunk_tokens) if self.chunk_tokens else len(self.chunk_ns)


class Distribution(_Record):
    """Summary of one metric over a set of values; percentiles by linear interpolation."""

    n: int
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None


class ArrivalStats(_Record):
    """Rate mode: the arrivals one window offered, how late they went out, and what piled up."""

    request_rate: float = Field(description="requests per second asked for")
    burstiness: float
    max_concurrency: int | None
    scheduled: int = Field(description="arrivals due inside the measured window")
    offered_rate: float | None = Field(description="arrivals / window length")
    gap_ms_mean: float | None
    gap_cv: float | None = Field(description="std/mean of the gaps (1 for Poisson)")
    schedule_lag_ms: Distribution = Field(
        description="actual send - scheduled send, not counting waits on max_concurrency"
    )
    client_queue_ms: Distribution = Field(description="waits on max_concurrency")
    outstanding_start: float = Field(description="due but not finished, first tenth")
    outstanding_end: float = Field(description="due but not finished, last tenth")
    over_saturated: bool
    over_saturation_reason: str | None = None


class WindowStats(_Record):
    """One measured window (a burst, or a steady-state window) of one cell repeat."""

    repeat: int
    mode: SweepMode
    concurrency: int
    requests_ok: int
    requests_failed: int
    duration_s: float
    output_tokens: int
    input_tokens: int
    aggregate_output_tok_s: float | None
    request_per_s: float | None
    goodput_request_per_s: float | None
    in_flight_mean: float | None = Field(description="time-weighted requests in flight")
    usage_mismatches: int
    prefix_cache_hit_tokens: int
    draft_tokens: int | None = Field(
        None, description="summed over the window's completed responses that report it"
    )
    draft_accepted_tokens: int | None = None
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    latency_ms: Distribution
    e2e_tok_s: Distribution
    input_tokens_per_request: Distribution
    errors: list[str] = Field(default_factory=list, description="first few distinct errors")
    arrivals: ArrivalStats | None = Field(None, description="rate mode: what was offered")


class ServerCounters(_Record):
    """What the server counted over a span (a cell): its /metrics, or for the drafter's
    tokens where /metrics has none, its per-response counts (llama.cpp `timings`).
    None = not published."""

    seconds: float
    preemptions: float | None = None
    prefix_cache_queries: float | None = Field(None, description="prompt tokens looked up")
    prefix_cache_hits: float | None = Field(None, description="prompt tokens found cached")
    spec_drafts: float | None = Field(None, description="drafter proposals (steps)")
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_acceptance_rate: float | None = Field(None, description="accepted / drafted tokens")
    spec_acceptance_rate_per_position: list[float] = Field(
        default_factory=list, description="accepted at draft position i / drafts"
    )
    spec_accept_length: float | None = Field(
        None, description="mean accepted per step, where only that gauge is published"
    )


class CellResult(_Record):
    """One (shape, concurrency) cell of a sweep: its repeats and their median."""

    shape: str
    input_tokens: int
    output_tokens: int
    concurrency: int = Field(description="burst/steady: the level; rate: max_concurrency or 0")
    mode: SweepMode
    request_rate: float | None = Field(None, description="rate mode: requests per second")
    over_saturated: bool = Field(False, description="rate mode: in flight grew through a window")
    server: ServerCounters | None = Field(None, description="the server's /metrics over the cell")
    prefix_cache_suspect: bool = Field(
        False, description="the server's prefix cache hit more than the chat template's head"
    )
    status: CellStatus
    reason: str | None = None
    repeats: list[WindowStats] = Field(default_factory=list)
    aggregate_output_tok_s_median: float | None = None
    aggregate_output_tok_s_min: float | None = None
    aggregate_output_tok_s_max: float | None = None
    ttft_ms_p50_median: float | None = None
    tpot_ms_p50_median: float | None = None

    @property
    def label(self) -> str:
        """What its requests' labels start with (cell_label)."""
        return cell_label(self.shape, self.concurrency, self.request_rate)

    def window_label(self, repeat: int) -> str:
        """The label of the requests of its measured window `repeat`."""
        return window_label(self.label, repeat)


class SweepSummary(_Record):
    """`summary.json` of a sweep job: every cell, including infeasible and failed ones."""

    kind: Literal["sweep"] = "sweep"
    base_url: str
    model: str
    endpoint: Literal["chat", "completions"]
    started_unix_s: float
    finished_unix_s: float | None = None
    wall_anchor_unix_s: float
    wall_anchor_ns: int
    settings: SweepSettings
    calibration: PromptCalibration | None
    cells: list[CellResult]
    counts: dict[str, int] = Field(description="cells measured / failed / infeasible")


class ProbePrompt(_Record):
    """One of the probe's prompts over its repeats."""

    index: int
    e2e_tok_s_median: float | None
    decode_tok_s_median: float | None
    ttft_ms_median: float | None
    repeats_ok: int
    repeat_identical: bool = Field(description="greedy text byte-identical across repeats")


class ProbeSummary(_Record):
    """`summary.json` of a probe job: the seeds' one-request table row."""

    kind: Literal["probe"] = "probe"
    base_url: str
    model: str
    endpoint: Literal["chat", "completions"]
    started_unix_s: float
    finished_unix_s: float | None = None
    settings: ProbeSettings
    prompts: list[ProbePrompt]
    e2e_tok_s: float | None = Field(description="geometric mean over prompts of the medians")
    decode_tok_s: float | None = Field(description="geometric mean over prompts of 1/TPOT")
    ttft_ms: float | None = Field(description="median over every measured request")
    at_once_aggregate_tok_s: float | None
    at_once_x_one: float | None = Field(description="at-once aggregate / one-request e2e tok/s")
    repeat_identical: int = Field(description="prompts whose text repeated byte for byte")
    texts_sha256: str | None = Field(
        None,
        description="sha256 of the prompts' greedy texts in prompt order, where every prompt's "
        "text repeated: two runs with the same digest wrote the same text",
    )
    requests_failed: int
    errors: list[str] = Field(default_factory=list)
    spec_draft_tokens: int | None = Field(
        None, description="the one-at-a-time requests' drafted tokens, where responses report it"
    )
    spec_accepted_tokens: int | None = None
