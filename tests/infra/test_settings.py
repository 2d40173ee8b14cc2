"""Context values: defaults, accepted forms, and bad input stopping synth with one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import (
    DEFAULT_AMI_PARAMETERS,
    DEFAULT_AZS,
    DEFAULT_INSTANCE_TYPE,
    SettingsError,
    parse_settings,
)
from tests.fixtures.cdk_synth import PROJECT_ROOT, feature_flags


def test_defaults() -> None:
    settings = parse_settings({})
    assert settings.availability_zones == DEFAULT_AZS
    assert settings.region == "us-east-1"
    assert settings.instance_type == DEFAULT_INSTANCE_TYPE
    assert settings.architecture == "x86_64"
    assert settings.root_volume_gib == 200
    assert settings.keep_results is False
    assert settings.max_hours == 24
    assert settings.ami_parameters == DEFAULT_AMI_PARAMETERS
    assert settings.instance_types == {"x86_64": "g6.xlarge"}


def test_strings_from_the_command_line_and_json_from_cdk_json_agree() -> None:
    from_cli = parse_settings(
        {
            "azs": "eu-central-1a, eu-central-1b",
            "instance_type": "g6e.2xlarge",
            "root_volume_gib": "400",
            "keep_results": "TRUE",
            "max_hours": "6",
        }
    )
    from_json = parse_settings(
        {
            "azs": ["eu-central-1a", "eu-central-1b"],
            "instance_type": "g6e.2xlarge",
            "root_volume_gib": 400,
            "keep_results": True,
            "max_hours": 6,
        }
    )
    assert from_cli == from_json
    assert from_cli.region == "eu-central-1"
    assert from_cli.availability_zones == ("eu-central-1a", "eu-central-1b")


def test_each_architecture_has_its_own_ami_and_default_type() -> None:
    settings = parse_settings({"instance_type": "g5g.2xlarge"})
    assert settings.architecture == "arm64"
    assert settings.instance_types == {"arm64": "g5g.2xlarge"}
    assert "/arm64/" in settings.ami_parameters["arm64"]
    assert "/x86_64/" in settings.ami_parameters["x86_64"]
    with pytest.raises(SettingsError, match=r"'ami_parameter_arm64': .* not an arm64 DLAMI"):
        parse_settings({"ami_parameter_arm64": DEFAULT_AMI_PARAMETERS["x86_64"]})


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"azs": "useast1a"}, "context 'azs': 'useast1a' is not an availability zone name"),
        ({"azs": "us-east-1"}, "context 'azs': 'us-east-1' is not an availability zone name"),
        ({"azs": ""}, "context 'azs': no availability zone given"),
        ({"azs": "us-east-1a,us-east-1a"}, "context 'azs': a zone is listed twice"),
        ({"azs": "us-east-1a,us-west-2a"}, "context 'azs': the zones span regions"),
        ({"azs": 3}, "context 'azs': expected comma-separated zone names"),
        ({"instance_type": "m7i.large"}, "context 'instance_type': m7i.large is not an NVIDIA GPU"),
        ({"instance_type": "g4ad.xlarge"}, "context 'instance_type': g4ad.xlarge is not an NVIDIA"),
        (
            {"instance_type": "g6xlarge"},
            "context 'instance_type': 'g6xlarge' is not an EC2 instance",
        ),
        ({"root_volume_gib": "50"}, "context 'root_volume_gib': 50 GiB is outside 100-4000"),
        ({"root_volume_gib": 99999}, "context 'root_volume_gib': 99999 GiB is outside 100-4000"),
        ({"root_volume_gib": "big"}, "context 'root_volume_gib': 'big' is not a whole number"),
        ({"root_volume_gib": True}, "context 'root_volume_gib': True is not a whole number"),
        ({"keep_results": "maybe"}, "context 'keep_results': 'maybe' is not true or false"),
        ({"max_hours": "0"}, "context 'max_hours': 0 hours is outside 1-168"),
        (
            {"ami_parameter_x86_64": "ami-0123"},
            "context 'ami_parameter_x86_64': 'ami-0123' is not an SSM",
        ),
    ],
)
def test_bad_values_name_the_key_in_one_line(context: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_settings(context)
    text = str(caught.value)
    assert text.startswith(message)
    assert "\n" not in text


def test_unknown_key_is_an_error() -> None:
    cdk = pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")
    import app as bench_app

    cdk_app = cdk.App(context={**feature_flags(), "instance-type": "g6.xlarge"})
    with pytest.raises(SettingsError, match="context 'instance-type': unknown key"):
        bench_app.build(cdk_app)


def test_app_stops_with_one_line_on_stderr(tmp_path: Path) -> None:
    """`python app.py` as the CDK CLI runs it (context in CDK_CONTEXT_JSON)."""
    pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**feature_flags(), "root_volume_gib": "20"}),
        "CDK_OUTDIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "app.py")],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "error: context 'root_volume_gib': 20 GiB is outside 100-4000\n"
    assert not (tmp_path / "manifest.json").exists()
