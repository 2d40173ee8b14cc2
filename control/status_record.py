"""One status parameter (`/bench/<campaign>/<shard>`), read with the agent's own record type.

The record is `contract.status.ShardStatus`, the model the agent publishes; a value that does
not parse is kept as a reading with the reason, so `bench status` shows it rather than failing
on it. The parameter's LastModifiedDate is kept too: it is SSM's own heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from contract.status import TERMINAL_PHASES, ShardStatus

__all__ = ["ACTIVE_PHASES", "TERMINAL_PHASES", "StatusReading", "read_status_value"]

# Past booting: the agent is up and at work (what `bench launch --wait` waits for).
ACTIVE_PHASES = (
    frozenset({"installing", "serving", "probing", "sweeping", "evaluating", "uploading"})
    | TERMINAL_PHASES
)


@dataclass(frozen=True, slots=True)
class StatusReading:
    """A status parameter as read.

    Attributes:
        campaign: from the parameter's name.
        shard: from the parameter's name.
        record: the agent's record; None if the value did not parse.
        modified: the parameter's LastModifiedDate.
        error: why the value did not parse.
    """

    campaign: str
    shard: str
    record: ShardStatus | None
    modified: datetime | None = None
    error: str | None = None

    @property
    def phase(self) -> str | None:
        return self.record.phase if self.record is not None else None

    @property
    def terminal(self) -> bool:
        """done, failed or interrupted: nothing more happens without a relaunch."""
        return self.record is not None and self.record.terminal

    @property
    def heartbeat(self) -> datetime | None:
        """The record's `updated_at`, else when the parameter was last written."""
        return self.record.updated_at if self.record is not None else self.modified


def read_status_value(
    campaign: str, shard: str, value: str, *, modified: datetime | None = None
) -> StatusReading:
    """Parse one parameter value."""
    try:
        record = ShardStatus.from_parameter_value(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "value"
        return StatusReading(campaign, shard, None, modified, f"{where}: {first['msg']}")
    return StatusReading(campaign, shard, record, modified)
