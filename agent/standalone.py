"""Writes `standalone.json` into a `bench probe|sweep|eval` results folder."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from agent.jobfolder import JobFolder
from agent.provenance import AGENT_VERSION, git_sha, host_info
from contract.standalone import StandaloneKind, StandaloneManifest

__all__ = ["write_standalone_manifest"]


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def write_standalone_manifest(
    out: Path,
    *,
    kind: StandaloneKind,
    base_url: str,
    models: list[str],
    settings: dict[str, object],
) -> Path:
    """Write (or replace) the folder's manifest; returns its path."""
    manifest = StandaloneManifest(
        kind=kind,
        tool_version=AGENT_VERSION,
        git_sha=git_sha(),
        base_url=_without_credentials(base_url),
        models=models,
        host=host_info(),
        settings=settings,
        written_unix_s=time.time(),
    )
    return JobFolder(out).write_standalone(manifest)
