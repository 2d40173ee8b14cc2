"""The ground truth: constants, the pace a request is served at, and the per-request
records of what was written when (`GroundTruthStore`). See the package docstring."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from array import array
from collections import deque
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)


TOKEN_TEXT = "tok "
CHAT_TEMPLATE_OVERHEAD = 8
# Special ids for the chat template's tokens, just past the 256 byte ids.
_TEMPLATE_HEAD_IDS = [256, 257, 258, 259]
_TEMPLATE_TAIL_IDS = [260, 261, 262, 263]
DEFAULT_MAX_TOKENS = 16
DEFAULT_MODEL = "reference-model"
DEFAULT_MAX_MODEL_LEN = 1 << 20
DEFAULT_STALL_S = 300.0
DEFAULT_FAULT_AFTER = 3
DEFAULT_FLAT_BATCH = 16
MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
# Bounds memory across a long flat-out benchmark; the oldest records go first.
DEFAULT_GT_MAX_CHUNKS = 20_000_000
LOG_FLUSH_RECORDS = 2000
FAULTS = ("500", "429", "400", "context", "nostream", "badsse", "disconnect", "stall")
USAGE_MODES = ("separate", "in_last_chunk", "none")
_FAULT_MARK = "FAULT:"
_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}

UsageMode = Literal["separate", "in_last_chunk", "none"]


class RequestError(Exception):
    """A request the server answers with an OpenAI-style JSON error."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclasses.dataclass(frozen=True)
class Pace:
    """How a completion is paced and shaped; see the module docstring for each field."""

    ttft_ms: float = 0.0
    itl_ms: float = 0.0
    tokens_per_chunk: int = 1
    usage_mode: UsageMode = "separate"
    reasoning_tokens: int = 0
    role_chunk: bool = False
    finish_on_last_token: bool = False
    flat_batch: int = DEFAULT_FLAT_BATCH
    fault_after: int = DEFAULT_FAULT_AFTER
    stall_s: float = DEFAULT_STALL_S

    def __post_init__(self) -> None:
        # One validation path for CLI flags and x_pace overrides, so both fail the same way.
        for name in ("ttft_ms", "itl_ms", "stall_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"pace.{name} must be a number >= 0, got {value!r}")
            if value > 3_600_000:
                raise ValueError(f"pace.{name} is over an hour: {value!r}")
        for name in ("tokens_per_chunk", "reasoning_tokens", "flat_batch", "fault_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"pace.{name} must be an integer >= 0, got {value!r}")
        if self.tokens_per_chunk < 1 or self.flat_batch < 1:
            raise ValueError("pace.tokens_per_chunk and pace.flat_batch must be >= 1")
        if self.usage_mode not in USAGE_MODES:
            raise ValueError(
                f"pace.usage_mode must be one of {USAGE_MODES}, got {self.usage_mode!r}"
            )
        for name in ("role_chunk", "finish_on_last_token"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"pace.{name} must be true or false")

    def with_overrides(self, overrides: Any) -> Pace:
        if overrides is None:
            return self
        if not isinstance(overrides, dict):
            raise ValueError("x_pace must be a JSON object")
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"x_pace has unknown fields {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **overrides)


# ----------------------------------------------------------------------------------------
# Ground truth records
# ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GroundTruthChunk:
    """One write to the socket: when, how many tokens it carried, and what it was."""

    t_write_ns: int
    tokens: int
    kind: str


@dataclasses.dataclass(frozen=True)
class GroundTruthRequest:
    """What the server did for one completion request; times are perf_counter_ns."""

    id: str
    endpoint: str
    model: str
    stream: bool
    streamed: bool
    status: int
    outcome: str
    fault: str | None
    t_recv_ns: int
    t_headers_ns: int | None
    t_done_ns: int | None
    prompt_tokens: int
    max_tokens: int
    completion_tokens: int
    request_id: str | None
    prompt_head: str
    pace: dict[str, Any]
    chunks: tuple[GroundTruthChunk, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GroundTruthRequest:
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in fields}
        kw["chunks"] = tuple(GroundTruthChunk(int(t), int(n), str(k)) for t, n, k in d["chunks"])
        return cls(**kw)

    @property
    def token_chunks(self) -> list[GroundTruthChunk]:
        """Chunks that carried content or reasoning tokens, in order."""
        return [c for c in self.chunks if c.tokens > 0 and c.kind != "body"]

    @property
    def first_chunk_ns(self) -> int | None:
        """Request parsed -> first SSE chunk of any kind."""
        return self.chunks[0].t_write_ns - self.t_recv_ns if self.chunks else None

    @property
    def ttft_ns(self) -> int | None:
        """Request parsed -> first chunk carrying content or reasoning (the design's TTFT)."""
        tc = self.token_chunks
        return tc[0].t_write_ns - self.t_recv_ns if tc else None

    @property
    def latency_ns(self) -> int | None:
        """Request parsed -> last chunk carrying tokens (the design's latency)."""
        tc = self.token_chunks
        return tc[-1].t_write_ns - self.t_recv_ns if tc else None

    @property
    def itl_ns(self) -> list[int]:
        """Gaps between consecutive token-carrying chunks."""
        tc = self.token_chunks
        return [b.t_write_ns - a.t_write_ns for a, b in itertools.pairwise(tc)]

    @property
    def tpot_ns(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1), the vllm bench serve definition."""
        tc = self.token_chunks
        n = sum(c.tokens for c in tc)
        if n < 2:
            return None
        return (tc[-1].t_write_ns - tc[0].t_write_ns) / (n - 1)


_KIND_ROLE = "role"
_KIND_REASONING = "reasoning"
_KIND_CONTENT = "content"
_KIND_FINISH = "finish"
_KIND_USAGE = "usage"
_KIND_DONE = "done"
_KIND_BADSSE = "badsse"
_KIND_BODY = "body"
_KIND_ERROR = "error"
_KIND_HEADERS = "headers"

# A plan entry: the exact bytes to write, tokens they carry, and the ground-truth kind.
PlanEntry = tuple[bytes, int, str]


class _Record:
    """Mutable in-flight ground truth; times are kept in an array, one per written entry."""

    __slots__ = (
        "completion_tokens",
        "endpoint",
        "fault",
        "id",
        "max_tokens",
        "model",
        "outcome",
        "pace",
        "plan",
        "prompt_head",
        "prompt_tokens",
        "request_id",
        "status",
        "stream",
        "streamed",
        "t_done_ns",
        "t_headers_ns",
        "t_recv_ns",
        "times",
    )

    def __init__(self, rid: str, t_recv_ns: int) -> None:
        self.id = rid
        self.t_recv_ns = t_recv_ns
        self.endpoint = ""
        self.model = ""
        self.stream = False
        self.streamed = False
        self.status = 0
        self.outcome = "in_progress"
        self.fault: str | None = None
        self.t_headers_ns: int | None = None
        self.t_done_ns: int | None = None
        self.prompt_tokens = 0
        self.max_tokens = 0
        self.completion_tokens = 0
        self.request_id: str | None = None
        self.prompt_head = ""
        self.pace: dict[str, Any] = {}
        self.plan: list[PlanEntry] = []
        self.times = array("q")

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        # The bare response head is not a chunk; its time is t_headers_ns.
        chunks = [
            [t, plan[k][1], plan[k][2]]
            for k, t in enumerate(self.times)
            if plan[k][2] != _KIND_HEADERS
        ]
        tokens = sum(plan[k][1] for k in range(len(self.times)))
        return {
            "id": self.id,
            "endpoint": self.endpoint,
            "model": self.model,
            "stream": self.stream,
            "streamed": self.streamed,
            "status": self.status,
            "outcome": self.outcome,
            "fault": self.fault,
            "t_recv_ns": self.t_recv_ns,
            "t_headers_ns": self.t_headers_ns,
            "t_done_ns": self.t_done_ns,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "completion_tokens": tokens,
            "request_id": self.request_id,
            "prompt_head": self.prompt_head,
            "pace": self.pace,
            "chunks": chunks,
        }


class GroundTruthStore:
    """Finished records in memory (bounded by chunk count) and the buffered JSONL log."""

    def __init__(self, log_path: Path | None, max_chunks: int = DEFAULT_GT_MAX_CHUNKS) -> None:
        self.records: deque[_Record] = deque()
        self.n_chunks = 0
        self.max_chunks = max_chunks
        self.dropped = 0
        self._log_path = log_path
        self._log_file = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115
        self._pending: list[_Record] = []

    def add(self, rec: _Record) -> None:
        self.records.append(rec)
        self.n_chunks += len(rec.times)
        while self.n_chunks > self.max_chunks and len(self.records) > 1:
            old = self.records.popleft()
            self.n_chunks -= len(old.times)
            self.dropped += 1
        if self._log_file is not None:
            # Serialising is deferred to flush time: JSON-encoding each record as it
            # finishes would steal CPU from the chunks still being sent.
            self._pending.append(rec)
            if len(self._pending) >= LOG_FLUSH_RECORDS:
                self.flush()

    def reset(self) -> None:
        self.records.clear()
        self.n_chunks = 0
        self.dropped = 0

    def dump(self) -> bytes:
        return json.dumps([r.to_json() for r in self.records], separators=(",", ":")).encode()

    def flush(self) -> None:
        if self._log_file is None or not self._pending:
            return
        lines = [json.dumps(r.to_json(), separators=(",", ":")) for r in self._pending]
        self._pending.clear()
        self._log_file.write("\n".join(lines) + "\n")
        self._log_file.flush()

    def close(self) -> None:
        self.flush()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
