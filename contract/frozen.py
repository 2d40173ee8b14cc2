"""The one base of the project's typed records: frozen pydantic models that refuse unknown
fields, so a typo in a spec or a stale field in a record is an error, never a default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["FrozenModel"]


class FrozenModel(BaseModel):
    """Immutable, validated once at the edge; unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
