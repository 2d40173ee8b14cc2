"""Installing an engine from its recipe's rendered steps: idempotent, logged, rerunnable.

Each engine gets a folder under the work dir: a `bin/` that servers find on PATH, an
`install.log` with every step's output, and one stamp per finished step holding a hash
of what ran. A recipe that installs with pip gets its own virtualenv (so vLLM's torch never
meets SGLang's, and no engine's meets the agent's), kept under the cache root
(`${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/envs/<engine>-<hash of its pip steps>`,
on the instance store where an instance has one) and shared by every work dir, with the
stamps of the steps that ran in it; a lock keeps two installs of one environment apart.
A rerun skips stamped steps; a changed step (new version, other GPU) runs. The venv has
a stamp of its own: one whose creation was cut short is made again, from empty.
A failed step raises `EngineInstallError` naming the engine, the step and the log's tail:
the runner fails that engine's jobs and goes on with the next engine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from agent.supervisor import redact_env
from contract.errors import BenchError
from contract.files import tail
from contract.processes import end_process_group
from engines.builds.llamacpp import default_cache_root
from engines.recipes import EngineRecipe, render_install
from engines.recipes.project import ProjectSourceError, project_source
from engines.recipes.render import GpuCC, RenderedInstallStep

__all__ = ["EngineInstallError", "InstalledEngine", "install_engine"]

log = logging.getLogger(__name__)

STEP_TIMEOUT_S = 3 * 3600
_POLL_S = 1.0
# Another process installing the same environment: wait for it at most this long.
ENV_LOCK_TIMEOUT_S = STEP_TIMEOUT_S
# Steps that change the environment rather than the work dir: stamped in the environment.
_ENV_KINDS = frozenset({"pip", "patch"})
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
    # What it took beyond the engine's own release, for the manifest (the seeds' "runs as
    # installed"): patches applied, packages added beside it, and whether anything compiled.
    patches: tuple[str, ...] = ()
    extra_packages: tuple[str, ...] = ()
    built_from_source: bool = False

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


def engine_env_dir(recipe: EngineRecipe, gpu_cc: GpuCC, cache_root: Path | None = None) -> Path:
    """The shared virtualenv of a pip engine: keyed by its pip steps as the recipe writes them."""
    steps = [s for s in render_install(recipe, gpu_cc, python="{python}") if s.kind in _ENV_KINDS]
    key = hashlib.sha256(json.dumps([[s.argv, s.env] for s in steps]).encode())
    try:
        project: Path | None = project_source()
    except ProjectSourceError:
        project = None
    if project is not None and any(str(project) in a for s in steps for a in s.argv):
        # The project installed editable: a change of its dependencies makes a new env.
        key.update((project / "pyproject.toml").read_bytes())
    digest = key.hexdigest()[:16]
    return (cache_root or default_cache_root()) / "envs" / f"{recipe.name}-{digest}"


def install_engine(
    recipe: EngineRecipe,
    gpu_cc: GpuCC,
    work_dir: Path,
    *,
    should_stop: Callable[[], bool] = lambda: False,
) -> InstalledEngine:
    """Run the recipe's install steps for this GPU that have not run yet.

    `should_stop` is polled while a step runs: when it turns true (a spot notice) the step's
    process group is stopped and `EngineInstallError` raised; the step stays unstamped.
    """
    folder = work_dir / "engines" / recipe.name
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_path = folder / "install.log"
    started = time.monotonic()
    steps = render_install(recipe, gpu_cc, bin_dir=bin_dir, install_dir=folder)
    if not any(step.kind == "pip" for step in steps):
        python = Path(sys.executable)
        ran, skipped = _run_steps(
            recipe,
            gpu_cc,
            python,
            sysconfig.get_paths()["purelib"],
            bin_dir,
            folder,
            log_path,
            should_stop=should_stop,
        )
    else:
        env_dir = engine_env_dir(recipe, gpu_cc)
        env_dir.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(env_dir) + ".lock", timeout=ENV_LOCK_TIMEOUT_S):
                venv = env_dir / "venv"
                python = _venv_python(venv)
                made = env_dir / ".venv.done"
                if not made.exists():
                    # A venv cut short (killed in ensurepip: bin/python and no pip) must not
                    # be taken for a made one: made again, with none of its steps' stamps.
                    _clear_env(env_dir, venv)
                    _run(
                        recipe.name,
                        "create venv",
                        [sys.executable, "-m", "venv", str(venv)],
                        {},
                        log_path,
                        should_stop,
                    )
                    made.write_text("venv\n")
                ran, skipped = _run_steps(
                    recipe,
                    gpu_cc,
                    python,
                    _site_packages(python),
                    bin_dir,
                    env_dir,
                    log_path,
                    folder,
                    should_stop=should_stop,
                )
        except Timeout as exc:
            raise EngineInstallError(
                recipe.name, "lock", f"another install of {env_dir} held it past the limit"
            ) from exc
    patches, extras, built = install_facts(recipe, steps)
    return InstalledEngine(
        engine=recipe.name,
        python=str(python),
        bin_dir=bin_dir,
        folder=folder,
        install_s=time.monotonic() - started,
        steps_run=ran,
        steps_skipped=skipped,
        patches=patches,
        extra_packages=extras,
        built_from_source=built,
    )


def _clear_env(env_dir: Path, venv: Path) -> None:
    """An engine environment back to empty: its venv and its steps' stamps."""
    shutil.rmtree(venv, ignore_errors=True)
    for stamp in env_dir.glob(".step-*.done"):
        stamp.unlink()


# pip options whose next word is a value, not a package.
_PIP_VALUED = frozenset(
    {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url"}
    | {"-f", "--find-links", "-t", "--target", "--python-version", "--platform"}
)


def install_facts(
    recipe: EngineRecipe, steps: tuple[RenderedInstallStep, ...]
) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """(patches, extra packages, built from source) of a rendered install.

    Extra packages are what the GPU variant's added pip steps install beside the engine's own
    install; anything compiled (CMake, cargo) is built from source.
    """
    own = {s.name for s in recipe.install} | {
        s.name for v in recipe.variants.values() for s in (v.install or ())
    }
    patches = tuple(s.name.removeprefix("patch ") for s in steps if s.kind == "patch")
    extras: list[str] = []
    for step in steps:
        if step.kind != "pip" or step.name in own or "install" not in step.argv:
            continue
        words = step.argv[step.argv.index("install") + 1 :]
        for before, word in zip(("", *words), words, strict=False):
            if not word.startswith("-") and before not in _PIP_VALUED and word not in extras:
                extras.append(word)
    built = any(s.kind in ("cmake", "cargo") for s in steps)
    return patches, tuple(extras), built


def _run_steps(
    recipe: EngineRecipe,
    gpu_cc: GpuCC,
    python: Path,
    site_packages: str,
    bin_dir: Path,
    env_stamps: Path,
    log_path: Path,
    work_stamps: Path | None = None,
    *,
    should_stop: Callable[[], bool],
) -> tuple[int, int]:
    """Run the unstamped steps; stamps of pip/patch steps go in env_stamps, others in work."""
    steps = render_install(
        recipe,
        gpu_cc,
        python=str(python),
        site_packages=site_packages,
        bin_dir=bin_dir,
        install_dir=log_path.parent,
    )
    ran = skipped = 0
    for index, step in enumerate(steps):
        digest = hashlib.sha256(
            json.dumps([step.argv, step.env], sort_keys=True).encode()
        ).hexdigest()[:16]
        where = env_stamps if step.kind in _ENV_KINDS or work_stamps is None else work_stamps
        stamp = where / f".step-{index}-{digest}.done"
        if stamp.exists():
            skipped += 1
            continue
        _run(recipe.name, step.name, list(step.argv), step.env, log_path, should_stop)
        stamp.write_text(step.name + "\n")
        ran += 1
    return ran, skipped


def _run(
    engine: str,
    name: str,
    argv: list[str],
    env: dict[str, str],
    log_path: Path,
    should_stop: Callable[[], bool],
) -> None:
    log.info("START install %s: %s", engine, name)
    started = time.monotonic()
    with log_path.open("a") as handle:
        handle.write(f"\n{time.strftime('%H:%M:%S')} START {name}\n$ {' '.join(argv)}\n")
        if env:
            handle.write(f"env: {redact_env(env)}\n")
        handle.flush()
        try:
            process = subprocess.Popen(
                argv,
                env={**os.environ, **env},
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: a stop reaches cmake's children
            )
        except OSError as exc:
            log_tail = tail(log_path, LOG_TAIL_LINES)
            raise EngineInstallError(engine, name, str(exc), log_tail) from exc
        try:
            returncode = _wait(process, started, should_stop)
        finally:
            # However the wait ended (the step exited, a stop, an exception in this process),
            # nothing the step started outlives it: a leftover compiler or pip would load
            # the machine while later jobs measure.
            end_process_group(process)
        elapsed = time.monotonic() - started
        handle.write(f"{time.strftime('%H:%M:%S')} END {name} rc={returncode} {elapsed:.1f}s\n")
    if returncode == _STOPPED:
        raise EngineInstallError(engine, name, "interrupted (the machine is being taken away)")
    if returncode == _TIMED_OUT:
        raise EngineInstallError(
            engine,
            name,
            f"took over {STEP_TIMEOUT_S} s; log {log_path}",
            tail(log_path, LOG_TAIL_LINES),
        )
    if returncode != 0:
        raise EngineInstallError(
            engine, name, f"exit code {returncode}; log {log_path}", tail(log_path, LOG_TAIL_LINES)
        )
    log.info("END install %s: %s (%.1f s)", engine, name, elapsed)


_STOPPED = -1000
_TIMED_OUT = -1001


def _wait(process: subprocess.Popen[bytes], started: float, should_stop: Callable[[], bool]) -> int:
    """The step's exit code, or _STOPPED / _TIMED_OUT after ending its process group."""
    while True:
        try:
            return process.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
        stop = should_stop()
        if stop or time.monotonic() - started > STEP_TIMEOUT_S:
            end_process_group(process)
            return _STOPPED if stop else _TIMED_OUT

