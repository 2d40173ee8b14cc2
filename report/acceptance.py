"""A drafter's acceptance, where the engine exposed it and the agent recorded it.

Read from a job's summary.json as written, wherever the counters sit (per window of a
sweep, or for the whole probe), under the names engines and the agent give them: drafted
tokens (the agent's per-cell `server.spec_draft_tokens`, `drafted_tokens`, vLLM's
`num_draft_tokens`), accepted tokens (`spec_accepted_tokens`, `accepted_tokens`,
`num_accepted_tokens`) and draft steps (`spec_drafts`, `num_drafts`, `draft_steps`); summed
over every place they appear. Acceptance rate = accepted / drafted; mean accepted length = 1 +
accepted / draft steps (the target's own token included, as vLLM reports it). None where
no counter was recorded: the report then says the engine did not expose it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from contract.results import SUMMARY_FILE
from report.load import ArmResults

__all__ = ["Acceptance", "acceptance_of", "read_acceptance"]

_DRAFTED = ("spec_draft_tokens", "drafted_tokens", "num_draft_tokens", "draft_tokens")
_ACCEPTED = ("spec_accepted_tokens", "accepted_tokens", "num_accepted_tokens")
_STEPS = ("spec_drafts", "num_drafts", "draft_steps")


@dataclass(frozen=True)
class Acceptance:
    drafted: int
    accepted: int
    steps: int | None

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.steps if self.steps else None


def _walk(value: object) -> Iterator[dict[str, object]]:
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _walk(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk(child)


def _first(mapping: dict[str, object], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = mapping.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def read_acceptance(summary: object) -> Acceptance | None:
    """Counters summed over every object of a summary that carries drafted and accepted."""
    drafted = accepted = steps = 0
    found = with_steps = False
    for mapping in _walk(summary):
        d, a = _first(mapping, _DRAFTED), _first(mapping, _ACCEPTED)
        if d is None or a is None:
            continue
        found = True
        drafted += d
        accepted += a
        s = _first(mapping, _STEPS)
        if s is not None:
            with_steps = True
            steps += s
    return Acceptance(drafted, accepted, steps if with_steps else None) if found else None


def acceptance_of(
    arm: ArmResults, items: tuple[str, ...] = ("probe", "sweep")
) -> Acceptance | None:
    """The first of `items` whose summary recorded acceptance."""
    for item in items:
        folder: Path | None = arm.job_dirs.get(item)
        if folder is None or not (folder / SUMMARY_FILE).is_file():
            continue
        try:
            found = read_acceptance(orjson.loads((folder / SUMMARY_FILE).read_bytes()))
        except orjson.JSONDecodeError:
            continue
        if found is not None:
            return found
    return None
