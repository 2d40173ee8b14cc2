"""An install step's processes never outlive it: stopped, failed, finished or abandoned.

A step runs in its own process group so a stop reaches a build's children (cmake's
compilers, pip's build backends). Whatever ends the wait (the step exiting, a spot notice,
an exception in the installing process such as a test's timeout), the whole group is ended:
a leftover compiler or pip would load the machine while later jobs measure latency.
Each step here starts a background `sleep` that would outlive it and writes its pid down.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.installer import EngineInstallError, install_engine
from engines.recipes.llamacpp import RECIPE as LLAMACPP
from engines.recipes.schema import EngineRecipe, InstallStep
from tests.fixtures.processes import gone


def _recipe(script: str) -> EngineRecipe:
    step = InstallStep(name="shell step", kind="cmake", argv=("bash", "-c", script), why="test")
    return LLAMACPP.model_copy(update={"install": (step,), "variants": {}})


def _pid_from(path: Path, within_s: float = 30.0) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"the step never wrote {path}")


def test_a_finished_step_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    recipe = _recipe(f"sleep 300 & echo $! > {pid_file}; exit 0")
    installed = install_engine(recipe, "cpu", tmp_path / "work")
    assert installed.steps_run == 1
    assert gone(_pid_from(pid_file))


def test_a_failed_step_leaves_nothing_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    recipe = _recipe(f"sleep 300 & echo $! > {pid_file}; exit 3")
    with pytest.raises(EngineInstallError, match="exit code 3"):
        install_engine(recipe, "cpu", tmp_path / "work")
    assert gone(_pid_from(pid_file))


def test_a_stopped_step_ends_its_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    recipe = _recipe(f"sleep 300 & echo $! > {pid_file}; wait")
    with pytest.raises(EngineInstallError, match="interrupted"):
        install_engine(recipe, "cpu", tmp_path / "work", should_stop=pid_file.exists)
    assert gone(_pid_from(pid_file))
    assert not list((tmp_path / "work" / "engines" / "llamacpp").glob(".step-*.done"))


class _Abandoned(BaseException):
    """What a test's timeout or Ctrl-C raises in the installing process."""


def test_a_step_abandoned_by_an_exception_in_the_installer_ends_its_group(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "child.pid"
    recipe = _recipe(f"sleep 300 & echo $! > {pid_file}; trap '' TERM; wait; sleep 300")

    def interrupted() -> bool:
        if pid_file.exists() and pid_file.read_text().strip():
            raise _Abandoned
        return False

    started = time.monotonic()
    with pytest.raises(_Abandoned):
        install_engine(recipe, "cpu", tmp_path / "work", should_stop=interrupted)
    child = _pid_from(pid_file)
    assert gone(child)
    # The leader ignored SIGTERM: it was killed after the grace, not waited for forever.
    assert time.monotonic() - started < 60


def test_a_venv_cut_short_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An install killed while the venv was being made (bin/python there, pip not yet)
    left an environment every later install took for made: its pip steps then failed
    with "No module named pip". The venv has a stamp of its own now."""
    import subprocess
    import sys

    from agent.installer import engine_env_dir

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    step = InstallStep(
        name="pip there", kind="pip", argv=("{python}", "-m", "pip", "--version"), why="test"
    )
    recipe = LLAMACPP.model_copy(update={"install": (step,), "variants": {}})
    env_dir = engine_env_dir(recipe, "cpu")
    env_dir.mkdir(parents=True)
    venv = env_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (env_dir / ".step-0-stale.done").write_text("a stamp of the venv cut short\n")
    installed = install_engine(recipe, "cpu", tmp_path / "work")
    assert installed.steps_run == 1
    assert not (env_dir / ".step-0-stale.done").exists()
    again = install_engine(recipe, "cpu", tmp_path / "work")
    assert (again.steps_run, again.steps_skipped) == (0, 1)
