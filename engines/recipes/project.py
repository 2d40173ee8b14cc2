"""Where the project's source tree is, for the engines that are the project's own code.

Our engines (`engines.pytorch`, and the JAX engine beside it) get their own environment, as
every pip engine does, with the project installed into it editable from its source tree plus
the framework build the GPU needs. That tree is the checkout in development and the unzipped
agent asset on an instance (`/opt/bench/app`, where agent/install.sh installs the agent from);
the installed distribution records it (PEP 610 `direct_url.json`).
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from contract.errors import BenchError

__all__ = ["DISTRIBUTION", "ProjectSourceError", "project_source"]

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
