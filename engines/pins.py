"""Do a campaign's engine pins install on its instances? Checked before anything is paid for.

A pin that its index does not publish fails on the instance, after boot, after the engines
before it (seed 000's LiteRT-LM 0.19.0 is not on PyPI). For every engine a campaign's shards
use, at the version the campaign installs (`engines.campaign.campaign_recipe`):

- pip steps: each `name==version` requirement is resolved, without installing or downloading
  the wheel, by `pip install --dry-run --no-deps --only-binary :all:` for the instance's
  platform (manylinux up to the AMI's glibc, its CPU architecture) and Python, on the index
  pip is configured with (PyPI). An sdist-only release counts as not resolving: the engine
  venvs install wheels.
- source builds (cargo, CMake): the pinned ref is named (a tag, a commit or a vendored
  release), never a moving branch.
- the project's own engine: its code is the agent's own git sha.

The instance facts are the DLAMI's (Ubuntu 24.04: glibc 2.39, python3 3.12, which makes the
engine venvs: agent/installer.py creates them with the agent's interpreter).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from contract.gpus import gpu_family
from contract.spec import LOCAL_INSTANCE_TYPE, CampaignSpec
from engines.campaign import campaign_recipe
from engines.recipes import EngineRecipe, RecipeError, render_install

__all__ = [
    "INSTANCE_GLIBC",
    "INSTANCE_PYTHON",
    "PinCheck",
    "check_pins",
    "pip_platforms",
    "resolve_on_index",
]

INSTANCE_PYTHON = "3.12"  # the DLAMI Ubuntu 24.04's python3 (infra/settings.py)
INSTANCE_GLIBC = (2, 39)  # Ubuntu 24.04
_MOVING_REFS = frozenset({"", "main", "master", "head", "latest", "nightly", "dev"})
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-\[\],]*)==(\S+)$")
# What pip prints when it cannot reach the index at all (not "no such version").
_UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "ConnectTimeoutError",
)
Resolver = Callable[[Sequence[str], str, str], dict[str, str | None]]


@dataclass(frozen=True, slots=True)
class PinCheck:
    """One engine's pin, checked for one CPU architecture.

    Attributes:
        engine: the engine's name.
        version: the version the campaign installs.
        arch: x86_64 or aarch64.
        how: pypi (a wheel on the index), source (a named ref built there) or project.
        ok: it installs, as far as can be told before launch.
        detail: the wheel that resolved, the ref, or why not.
    """

    engine: str
    version: str
    arch: str
    how: Literal["pypi", "source", "project"]
    ok: bool
    detail: str

    def line(self) -> str:
        verdict = "ok" if self.ok else "DOES NOT RESOLVE"
        return f"{self.engine} {self.version} ({self.how}, {self.arch}): {verdict}: {self.detail}"


def pip_platforms(arch: str, glibc: tuple[int, int] = INSTANCE_GLIBC) -> list[str]:
    """pip `--platform` tags a glibc `glibc` machine of `arch` accepts (pip does not expand a
    `manylinux_2_NN` tag to the older ones itself)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


def resolve_on_index(
    requirements: Sequence[str],
    arch: str,
    python: str = INSTANCE_PYTHON,
    *,
    timeout_s: float = 180,
) -> dict[str, str | None]:
    """requirement -> the wheel file it resolves to on the configured index for a Linux
    `arch` machine with CPython `python` (None: nothing resolves). One pip run for all; only
    when that fails is each requirement resolved alone, to name the one at fault.

    Raises:
        OSError: pip could not be run, or did not answer in time.
    """
    if not requirements:
        return {}
    together = _pip_dry_run(list(requirements), arch, python, timeout_s)
    if together is not None:
        return together
    if len(requirements) == 1:
        return {requirements[0]: None}
    found: dict[str, str | None] = {}
    for requirement in requirements:
        alone = _pip_dry_run([requirement], arch, python, timeout_s)
        found[requirement] = (alone or {}).get(requirement)
    return found


def _pip_dry_run(
    requirements: list[str], arch: str, python: str, timeout_s: float
) -> dict[str, str | None] | None:
    platforms = [arg for tag in pip_platforms(arch) for arg in ("--platform", tag)]
    with tempfile.TemporaryDirectory(prefix="bench-pins-") as scratch:
        report = Path(scratch) / "report.json"
        argv = [
            sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
            "--no-deps", "--only-binary", ":all:", *platforms, "--python-version", python,
            "--implementation", "cp", "--target", str(Path(scratch) / "target"), "--quiet",
            "--disable-pip-version-check", "--report", str(report), *requirements,
        ]  # fmt: skip
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise OSError(f"pip did not answer within {timeout_s:g} s") from exc
        if done.returncode != 0 or not report.exists():
            if any(marker in done.stderr for marker in _UNREACHABLE):
                raise OSError(f"the package index is not reachable: {_last_line(done.stderr)}")
            return None
        installs = json.loads(report.read_text()).get("install", [])
    wheels: dict[str, str] = {}
    for item in installs:
        name = _normal(str(item.get("metadata", {}).get("name", "")))
        wheels[name] = str(item.get("download_info", {}).get("url", "")).rsplit("/", 1)[-1]
    return {r: wheels.get(_normal(_name(r))) for r in requirements}


def _name(requirement: str) -> str:
    match = _PIN.match(requirement)
    return match.group(1) if match else requirement


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "pip failed"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


def check_pins(
    specs: Sequence[CampaignSpec], *, resolve: Resolver | None = None
) -> list[PinCheck]:
    """Every engine pin of the specs' shards, checked once per engine, version and CPU
    architecture; the index is asked once per architecture.

    Args:
        specs: checked campaign specs (`engines.campaign.check_campaign`).
        resolve: (requirements, arch, python) -> {requirement: wheel or None};
            `resolve_on_index` by default.
    """
    resolver = resolve or (lambda reqs, arch, py: resolve_on_index(reqs, arch, py))
    todo: dict[tuple[str, str, str], tuple[EngineRecipe, tuple[int, int] | None, str]] = {}
    for spec in specs:
        for shard in spec.shards:
            if shard.instance_type == LOCAL_INSTANCE_TYPE:
                continue  # installs on this machine, with `bench run`
            family = gpu_family(shard.instance_type)
            arch = "aarch64" if family is not None and family.cpu_arch == "arm64" else "x86_64"
            gpu_cc = family.compute_capability if family is not None else None
            for arm in shard.arms:
                try:
                    recipe = campaign_recipe(spec, arm)
                except RecipeError:
                    continue  # the spec check reports it
                todo.setdefault((recipe.name, recipe.version, arch), (recipe, gpu_cc, arch))
    wanted: dict[str, set[str]] = {}
    for recipe, gpu_cc, arch in todo.values():
        wanted.setdefault(arch, set()).update(_requirements(recipe, gpu_cc))
    resolved = {
        arch: resolver(sorted(reqs), arch, INSTANCE_PYTHON) for arch, reqs in wanted.items()
    }
    return [
        _check_recipe(recipe, gpu_cc, arch, resolved.get(arch, {}))
        for recipe, gpu_cc, arch in todo.values()
    ]


def _requirements(recipe: EngineRecipe, gpu_cc: tuple[int, int] | None) -> list[str]:
    return [
        arg
        for step in render_install(recipe, gpu_cc)
        if step.kind == "pip"
        for arg in step.argv
        if _PIN.match(arg)
    ]


def _check_recipe(
    recipe: EngineRecipe,
    gpu_cc: tuple[int, int] | None,
    arch: str,
    resolved: dict[str, str | None],
) -> PinCheck:
    kinds = {step.kind for step in render_install(recipe, gpu_cc)}

    def check(how: Literal["pypi", "source", "project"], ok: bool, detail: str) -> PinCheck:
        return PinCheck(recipe.name, recipe.version, arch, how, ok, detail)

    if not kinds or recipe.version == "project":
        return check("project", True, recipe.version_note or "the project's own code")
    requirements = _requirements(recipe, gpu_cc)
    if requirements:
        missing = [r for r in requirements if resolved.get(r) is None]
        if missing:
            return check(
                "pypi",
                False,
                f"{', '.join(missing)}: no wheel for CPython {INSTANCE_PYTHON} on manylinux "
                f"{arch} on the package index",
            )
        return check("pypi", True, ", ".join(str(resolved[r]) for r in requirements))
    if kinds & {"cargo", "cmake"}:
        if recipe.version.strip().lower() in _MOVING_REFS:
            return check("source", False, f"source build of a moving ref {recipe.version!r}")
        return check("source", True, f"built from the named ref {recipe.version}")
    return check("project", True, recipe.version_note or "no install step pins a version")
