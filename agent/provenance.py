"""Where a run comes from, for the manifest: the agent's version and git sha, the host, each
arm as its recipe reads it, exactly which engine binary serves (its version probe's output and
sha256), and the manifest an earlier run of the same shard left (a rerun merges into it, never
drops it)."""

from __future__ import annotations

import logging
import os
import platform
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil

from agent.installer import InstalledEngine
from contract.files import sha256_file
from contract.jobs import ArmFacts, HostInfo, Manifest
from engines.recipes import RecipeError, RenderedServe, recipe_for_arm
from engines.recipes.render import parse_arm

__all__ = ["AGENT_VERSION", "arm_facts", "earlier_manifest", "git_sha", "host_info", "identify"]

AGENT_VERSION = "0.1.0"

log = logging.getLogger(__name__)


def git_sha() -> str | None:
    sha = os.environ.get("BENCH_GIT_SHA")
    if sha:
        return sha
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def host_info() -> HostInfo:
    return HostInfo(
        hostname=socket.gethostname(),
        os=platform.platform(),
        python=platform.python_version(),
        cpu=platform.processor() or platform.machine(),
        cpus=os.cpu_count() or 0,
        memory_mib=int(psutil.virtual_memory().total / 2**20),
    )


def identify(served: RenderedServe, installed: InstalledEngine) -> tuple[str | None, str | None]:
    """What exactly will serve: (the recipe's version probe output, the binary's sha256)."""
    env = {**os.environ, "PATH": installed.path_env()}
    executable = shutil.which(served.argv[0], path=env["PATH"]) if served.argv else None
    digest = None
    if executable and not executable.endswith(("python", "python3")):
        digest = sha256_file(Path(executable))
    text = None
    if served.version_probe:
        try:
            out = subprocess.run(
                list(served.version_probe),
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            text = " ".join((out.stdout + out.stderr).split())[:500] or None
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"version probe failed: {exc}"
    return text, digest


def arm_facts(arm: str) -> ArmFacts | None:
    """The arm as its recipe reads it; None for an arm no recipe knows (its jobs fail)."""
    try:
        recipe = recipe_for_arm(arm)
        parsed = parse_arm(recipe, arm)
    except RecipeError:
        return None
    return ArmFacts(
        arm=arm,
        engine=recipe.name,
        display_name=recipe.display_name,
        drafter=parsed.drafter,
        draft_tokens=parsed.draft_tokens,
    )


def earlier_manifest(path: Path, campaign: str, shard: str) -> Manifest | None:
    """The manifest an earlier run of this shard left, if readable (else it is kept aside)."""
    if not path.exists():
        return None
    try:
        earlier = Manifest.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as exc:
        aside = path.with_suffix(f".unreadable-{int(time.time())}.json")
        log.warning("earlier %s unreadable (%s); kept as %s", path.name, exc, aside.name)
        path.rename(aside)
        return None
    if (earlier.campaign.name, earlier.shard) != (campaign, shard):
        raise ValueError(
            f"{path} belongs to {earlier.campaign.name}/{earlier.shard}, not {campaign}/{shard}"
        )
    return earlier
