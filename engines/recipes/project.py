"""Where the project's source tree is, and how an engine that is the project's own code
installs it.

Our engines (`engines.pytorch`, and the JAX engine beside it) get their own environment, as
every pip engine does, with the project installed into it editable from its source tree plus
the framework build the GPU needs (`own_engine_install`, the one step both recipes use).
That tree is the checkout in development and the unzipped agent asset on an instance
(`/opt/bench/app`, where agent/install.sh installs the agent from); the installed
distribution records it (PEP 610 `direct_url.json`).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from contract.errors import BenchError
from engines.recipes.schema import InstallStep

__all__ = ["DISTRIBUTION", "ProjectSourceError", "own_engine_install", "project_source"]

DISTRIBUTION = "llm-serving-bench"


class ProjectSourceError(BenchError, RuntimeError):
    """The project's source tree cannot be found (installed from a wheel, not a folder)."""


def project_source() -> Path:
    """The folder holding the project's pyproject.toml.

    Raises:
        ProjectSourceError: neither this module's tree nor the installed distribution's
            recorded source folder holds a pyproject.toml.
    """
    here = Path(__file__).resolve().parents[2]
    if (here / "pyproject.toml").is_file():
        return here
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        text = None
    if text:
        url = urlparse(json.loads(text).get("url", ""))
        if url.scheme == "file":
            folder = Path(unquote(url.path))
            if (folder / "pyproject.toml").is_file():
                return folder
    raise ProjectSourceError(
        f"{DISTRIBUTION}: no source tree found (not beside {here}, and the installed "
        "distribution records no folder); install the project from its folder"
    )


def own_engine_install(name: str, framework: str, extra: str, *, why: str) -> InstallStep:
    """The install step of an engine that is the project's own code: into the engine's own
    environment, `framework` (a pip requirement: the build this machine needs) and the
    project, editable from its source tree (`{project}`) with its `extra`, so the engine's
    `python -m engines.<name>` imports the checkout or asset the agent runs from."""
    return InstallStep(
        name=name,
        kind="pip",
        argv=(
            "{python}",
            "-m",
            "pip",
            "install",
            framework,
            "--editable",
            f"{{project}}[{extra}]",
        ),
        why=why,
    )
