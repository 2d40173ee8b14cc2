"""The agent's environment built exactly as an instance builds it, and our engine's own.

The user data unzips the agent asset and runs `agent/install.sh` with the AMI's python3; here
the asset CDK staged is zipped, unzipped with the same command and installed with the same
script into a fresh virtual environment (no `--system-site-packages`, no PYTHONPATH: nothing
borrowed from the dev environment). Then the packages the agent imports only when a job
needs them must import (issue 21, item 1), the agent's environment must hold no torch, and
the PyTorch engine gets torch in its own environment from its recipe (item 2).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.installer import install_engine
from agent.preflight import LAZY_IMPORTS
from engines.recipes.jax import RECIPE as JAX
from engines.recipes.pytorch import RECIPE as PYTORCH
from infra.user_data import TEMPLATE_PATH
from tests.fixtures.cdk_synth import Synthesized

INSTALL_SCRIPT = "agent/install.sh"


def _clean_env() -> dict[str, str]:
    """The environment a root shell in cloud-init would have: no venv, no PYTHONPATH."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_user_data_installs_the_agent_with_the_assets_install_script() -> None:
    text = TEMPLATE_PATH.read_text()
    assert re.search(
        r'^PYTHON=python3 bash "\$\{APP_DIR\}/agent/install\.sh" "\$\{APP_DIR\}" "\$\{VENV_DIR\}"$',
        text,
        re.MULTILINE,
    )
    # The unit starts the agent from that same environment.
    assert "ExecStart=${VENV_DIR}/bin/python3 -m agent --work-dir ${CACHE_ROOT}/work" in text
    # No reliance on the AWS CLI: the asset comes through the system Python's boto3.
    assert "aws s3" not in text and 'boto3.client("s3"' in text
    # Caches on the instance store where there is one.
    assert 'mountpoint -q "${NVME}"' in text and "BENCH_CACHE_DIR=" in text


def test_the_bfcl_pin_installed_without_deps_is_the_one_the_task_expects() -> None:
    from agent.evals.bfcl import BFCL_EVAL_VERSION

    pins = Path("agent/requirements-nodeps.txt").read_text()
    assert f"bfcl-eval=={BFCL_EVAL_VERSION}" in pins.splitlines()


@pytest.mark.slow
def test_the_asset_installed_as_the_user_data_does_has_what_the_agent_imports(
    synthesized: Synthesized, tmp_path: Path
) -> None:
    staged = synthesized.outdir / synthesized.stack.agent_asset.asset.asset_path
    # CDK zips the staged folder at publish; the instance unzips it with the stdlib.
    archive = tmp_path / "agent.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(staged.rglob("*")):
            zipped.write(path, path.relative_to(staged))
    app_dir, venv = tmp_path / "app", tmp_path / "venv"
    python3 = shutil.which("python3") or sys.executable
    env = _clean_env()
    subprocess.run(
        [python3, "-m", "zipfile", "-e", str(archive), str(app_dir)], check=True, env=env
    )
    result = subprocess.run(
        ["bash", str(app_dir / INSTALL_SCRIPT), str(app_dir), str(venv)],
        env={**env, "PYTHON": python3},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    agent_python = str(venv / "bin" / "python3")

    def run(code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [agent_python, "-c", code],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # install.sh already ran the preflight; ask again, module by module, to name a failure.
    for module in LAZY_IMPORTS:
        assert run(f"import {module}").returncode == 0, module
    checked = run(
        "from agent.evals.bfcl import official; official(); "
        "from engines.recipes.project import project_source; print(project_source())"
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    # The PyTorch engine's environment is built from the instance's copy of the source.
    assert checked.stdout.strip() == str(app_dir)
    assert run("import torch").returncode != 0, "the agent's environment must not carry torch"


@pytest.mark.slow
def test_the_pytorch_engine_gets_torch_in_its_own_environment(tmp_path: Path) -> None:
    installed = install_engine(PYTORCH, "cpu", tmp_path)
    assert not Path(installed.python).is_relative_to(sys.prefix)
    probe = subprocess.run(
        [
            installed.python,
            "-c",
            "import torch, engines.pytorch, pathlib; print(torch.__version__); "
            "print(pathlib.Path(engines.pytorch.__file__).parents[2])",
        ],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    version, source = probe.stdout.split()
    assert version.split("+")[0] == "2.13.0"
    assert Path(source) == Path(__file__).resolve().parents[2]
    # A second work dir reuses the environment: nothing reinstalls.
    again = install_engine(PYTORCH, "cpu", tmp_path / "other")
    assert (again.python, again.steps_run) == (installed.python, 0)


@pytest.mark.slow
def test_the_jax_engine_gets_the_project_in_its_own_environment(tmp_path: Path) -> None:
    # `python -m engines.jax` runs from the engine's environment: JAX and the project's
    # `jax` extra (the HTTP layer, tokenizer) must both be in it, and no torch.
    installed = install_engine(JAX, "cpu", tmp_path)
    probe = subprocess.run(
        [
            installed.python,
            "-c",
            "import jax, engines.jax.server, importlib.util, pathlib; print(jax.__version__); "
            "print(pathlib.Path(engines.jax.__file__).parents[2]); "
            "print(importlib.util.find_spec('torch') is None)",
        ],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    version, source, no_torch = probe.stdout.split()
    assert version == JAX.version
    assert Path(source) == Path(__file__).resolve().parents[2]
    assert no_torch == "True"
