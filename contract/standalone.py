"""`standalone.json`: what a `bench probe`, `bench sweep` or `bench eval` folder measured.

A campaign's shard has `manifest.json`; a standalone run against a server the user already
runs has this smaller record beside its `summary.json`: the server's URL, the model(s)
asked, the host the client ran on, the tool's version and the settings, so the folder can be
reported and compared like a campaign's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from contract.frozen import FrozenModel
from contract.jobs import HostInfo

__all__ = ["STANDALONE_FILE", "StandaloneKind", "StandaloneManifest"]

STANDALONE_FILE = "standalone.json"
StandaloneKind = Literal["probe", "sweep", "eval"]


class StandaloneManifest(FrozenModel):
    kind: StandaloneKind
    tool_version: str
    git_sha: str | None
    base_url: str = Field(description="the server measured (never with credentials)")
    models: list[str]
    host: HostInfo = Field(description="where the client ran")
    settings: dict[str, object]
    written_unix_s: float
