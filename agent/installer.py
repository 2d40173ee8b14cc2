"""Installing an engine from its recipe's rendered steps: idempotent, logged, rerunnable.

Each engine gets a folder under the work dir: its own virtualenv when its recipe installs
with pip (so vLLM's torch never meets SGLang's), a `bin/` that servers find on PATH, an
`install.log` with every step's output, and one stamp per finished step holding a hash
of what ran. A rerun skips stamped steps; a changed step (new version, other GPU) runs.
A failed step raises `EngineInstallError` naming the engine, the step and the log's tail:
the runner fails that engine's jobs and goes on with the next engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from agent.supervisor import redact_env
from contract.errors import BenchError
from contract.files import tail
from engines.recipes import EngineRecipe, render_install
from engines.recipes.render import GpuCC

__all__ = ["EngineInstallError", "InstalledEngine", "install_engine"]

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 3 * 3600
LOG_TAIL_LINES = 30


class EngineInstallError(BenchError, RuntimeError):
    def __init__(self, engine: str, step: str, reason: str, log_tail: str = "") -> None:
        self.engine, self.step, self.log_tail = engine, step, log_tail
        super().__init__(f"{engine}: install step {step!r} failed: {reason}")


@dataclass(frozen=True)
class InstalledEngine:
    """Where an installed engine lives: what render() needs to start it."""

    engine: str
    python: str
    bin_dir: Path
    folder: Path
    install_s: float
    steps_run: int
    steps_skipped: int

    def path_env(self, base: str | None = None) -> str:
        return os.pathsep.join(p for p in (str(self.bin_dir), base or os.environ["PATH"]) if p)


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _site_packages(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def install_engine(recipe: EngineRecipe, gpu_cc: GpuCC, work_dir: Path) -> InstalledEngine:
    """Run the recipe's install steps for this GPU that have not run yet."""
    folder = work_dir / "engines" / recipe.name
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_path = folder / "install.log"
    started = time.monotonic()
    steps = render_install(recipe, gpu_cc, bin_dir=bin_dir)
    needs_venv = any(step.kind == "pip" for step in steps)
    if needs_venv:
        venv = folder / "venv"
        python = _venv_python(venv)
        if not python.exists():
            _run(
                recipe.name, "create venv", [sys.executable, "-m", "venv", str(venv)], {}, log_path
            )
        site_packages = _site_packages(python)
    else:
        python = Path(sys.executable)
        site_packages = sysconfig.get_paths()["purelib"]
    steps = render_install(
        recipe, gpu_cc, python=str(python), site_packages=site_packages, bin_dir=bin_dir
    )
    ran = skipped = 0
    for index, step in enumerate(steps):
        digest = hashlib.sha256(
            json.dumps([step.argv, step.env], sort_keys=True).encode()
        ).hexdigest()[:16]
        stamp = folder / f".step-{index}-{digest}.done"
        if stamp.exists():
            skipped += 1
            continue
        _run(recipe.name, step.name, list(step.argv), step.env, log_path)
        stamp.write_text(step.name + "\n")
        ran += 1
    return InstalledEngine(
        engine=recipe.name,
        python=str(python),
        bin_dir=bin_dir,
        folder=folder,
        install_s=time.monotonic() - started,
        steps_run=ran,
        steps_skipped=skipped,
    )


def _run(engine: str, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
    log.info("START install %s: %s", engine, name)
    started = time.monotonic()
    with log_path.open("a") as handle:
        handle.write(f"\n{time.strftime('%H:%M:%S')} START {name}\n$ {' '.join(argv)}\n")
        if env:
            handle.write(f"env: {redact_env(env)}\n")
        handle.flush()
        try:
            result = subprocess.run(
                argv,
                env={**os.environ, **env},
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=STEP_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log_tail = tail(log_path, LOG_TAIL_LINES)
            raise EngineInstallError(engine, name, str(exc), log_tail) from exc
        elapsed = time.monotonic() - started
        handle.write(
            f"{time.strftime('%H:%M:%S')} END {name} rc={result.returncode} {elapsed:.1f}s\n"
        )
    if result.returncode != 0:
        raise EngineInstallError(
            engine,
            name,
            f"exit code {result.returncode}; log {log_path}",
            tail(log_path, LOG_TAIL_LINES),
        )
    log.info("END install %s: %s (%.1f s)", engine, name, elapsed)
