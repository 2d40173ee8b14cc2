"""The shard status record: what the agent publishes to SSM and `bench status` reads back.

One JSON document per shard, in the String parameter `/bench/<campaign>/<shard>`
(`contract.layout.status_parameter_name`), replaced at every phase change and at least once
a minute as a heartbeat (docs/DESIGN.md, "Status record"). A Standard-tier parameter holds at most
4 KB, so `to_parameter_value` truncates the free-text fields until the document fits: the
status must always publish, and a long error message is the one thing that can grow.

Times are UTC, written as ISO 8601. `updated_at` is the heartbeat: a reader that sees it go
stale knows the agent (or its instance) is gone, whatever the phase says.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from contract.frozen import FrozenModel

__all__ = [
    "STATUS_MAX_BYTES",
    "TERMINAL_PHASES",
    "Market",
    "Phase",
    "ShardStatus",
]

# SSM Standard-tier parameter values are limited to 4 KB.
STATUS_MAX_BYTES = 4096

Phase = Literal[
    "booting",
    "installing",
    "serving",
    "probing",
    "sweeping",
    "evaluating",
    "uploading",
    "done",
    "failed",
    "interrupted",
]
TERMINAL_PHASES: frozenset[str] = frozenset({"done", "failed", "interrupted"})
Market = Literal["spot", "on-demand"]

# Free-text fields, in the order they are cut when the document is too long: the error
# first (its head says what happened), then the rest, which are short in practice.
_TRUNCATABLE = ("last_error", "upload_error", "current_job", "results_uri")
_ELLIPSIS = "…"


class ShardStatus(FrozenModel):
    """One shard's state, as of `updated_at`."""

    campaign: str
    shard: str
    instance_id: str | None = Field(None, description="EC2 instance id; None off AWS")
    market: Market | None = Field(None, description="spot or on-demand; None off AWS")
    phase: Phase
    job_index: int = Field(0, ge=0, description="1-based index of the current job; 0 = none yet")
    jobs_total: int | None = Field(None, ge=0, description="jobs in this shard, once known")
    current_job: str | None = None
    started_at: datetime
    updated_at: datetime = Field(description="heartbeat: refreshed at least once a minute")
    eta: datetime | None = Field(None, description="estimated end of the shard's last job")
    last_error: str | None = Field(None, description="latest failure, truncated to fit")
    results_uri: str | None = Field(None, description="s3://bucket/results/<campaign>/<shard>/")
    uploads_pending: int = Field(
        0, ge=0, description="finished jobs still only on the instance's disk (S3 unreachable)"
    )
    upload_error: str | None = Field(None, description="why uploads are pending")

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def to_parameter_value(self, max_bytes: int = STATUS_MAX_BYTES) -> str:
        """The JSON for the SSM parameter, at most `max_bytes` of UTF-8.

        Free-text fields are cut (with a trailing "…") until the document fits; this never
        fails for size with names that `contract.layout` accepts.

        Raises:
            ValueError: even with every free-text field emptied it does not fit (cannot
                happen with valid campaign and shard names and max_bytes >= 1024).
        """
        record = self
        text = record.model_dump_json()
        for field in _TRUNCATABLE:
            if len(text.encode()) <= max_bytes:
                break
            value: str | None = getattr(record, field)
            if not value:
                continue
            # JSON escapes make a character cost 1 to 6 bytes, so search for the longest
            # prefix that fits rather than computing it.
            low, high = 0, len(value) - 1
            best = record.model_copy(update={field: _ELLIPSIS})
            while low <= high:
                keep = (low + high) // 2
                trial = record.model_copy(update={field: value[:keep] + _ELLIPSIS})
                if len(trial.model_dump_json().encode()) <= max_bytes:
                    best, low = trial, keep + 1
                else:
                    high = keep - 1
            record = best
            text = record.model_dump_json()
        if len(text.encode()) > max_bytes:
            raise ValueError(f"status of {self.campaign}/{self.shard} exceeds {max_bytes} bytes")
        return text

    @classmethod
    def from_parameter_value(cls, value: str) -> ShardStatus:
        """Parse a published status (raises pydantic.ValidationError on a malformed one)."""
        return cls.model_validate_json(value)
