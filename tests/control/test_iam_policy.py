"""`bench iam-policy` allows every AWS call the CLI makes, and nothing broad.

Every call is recorded through botocore's own event hooks (`provide-client-params`, on every
session the CLI makes) while `bench plan`, `launch`, `status`, `fetch` and `cleanup` run
in-process against the moto BenchStack, and while the report's price book asks what it asks.
Each call is then mapped to the IAM action and resource ARNs AWS authorizes it against (the
Service Authorization Reference's table for these operations) and checked against the
policy's Allow statements; conditions are checked for their presence where they matter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest

from cli.main import main
from contract.layout import TAG_CAMPAIGN
from control.instances import TAG_MAX_RUNTIME_H
from control.stack import StackOutputs
from report.prices import choose_prices
from tests.control.conftest import write_spec

# botocore's service ids -> IAM action prefixes, where they differ.
_PREFIX = {"service-quotas": "servicequotas"}
# S3 operations authorized as another action.
_S3_ACTION = {
    "HeadBucket": "s3:ListBucket",
    "ListObjectsV2": "s3:ListBucket",
    "ListObjects": "s3:ListBucket",
    "HeadObject": "s3:GetObject",
}


class Recorder:
    """Every API call of every botocore session created while installed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, event_name: str, params: dict[str, Any], **_: Any) -> None:
        _, service, operation = event_name.split(".", 2)
        self.calls.append((service, operation, dict(params)))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        make = botocore.session.get_session

        def get_session(*args: Any, **kwargs: Any) -> botocore.session.Session:
            session = make(*args, **kwargs)
            session.register("provide-client-params", self)
            return session

        monkeypatch.setattr(botocore.session, "get_session", get_session)


def _authorized_as(
    service: str, operation: str, params: dict[str, Any], arn: Callable[[str], str], bucket: str
) -> list[tuple[str, str]]:
    """(action, resource) pairs IAM checks for one call."""
    prefix = _PREFIX.get(service, service)
    action = f"{prefix}:{operation}"
    if service == "s3":
        key = params.get("Key")
        action = _S3_ACTION.get(operation, action)
        resource = f"arn:aws:s3:::{bucket}" + (f"/{key}" if key else "")
        return [(action, resource)]
    if service == "ssm":
        names = params.get("Names") or [params.get("Name") or params.get("Path")]
        return [(action, arn(f"ssm:parameter{name}")) for name in names]
    if service == "cloudformation":
        return [(action, arn(f"cloudformation:stack/{params['StackName']}/id"))]
    if service == "iam":
        return [(action, f"arn:aws:iam::123456789012:role/aws-service-role/spot.amazonaws.com/"
                 f"{params['RoleName']}")]  # fmt: skip
    if service == "ec2" and operation == "RunInstances":
        template = params["LaunchTemplate"]["LaunchTemplateId"]
        return [
            (action, arn(f"ec2:launch-template/{template}")),
            (action, arn(f"ec2:subnet/{params['SubnetId']}")),
            (action, arn("ec2:instance/i-new")),
            (action, arn("ec2:volume/vol-new")),
        ]
    if service == "ec2" and operation == "TerminateInstances":
        return [(action, arn(f"ec2:instance/{i}")) for i in params["InstanceIds"]]
    if service == "service-quotas":
        return [(action, arn(f"servicequotas:ec2/{params['QuotaCode']}"))]
    if service == "secretsmanager":
        return [(action, params["SecretId"])]
    return [(action, "*")]


def _allowing(policy: dict[str, Any], action: str, resource: str) -> list[dict[str, Any]]:
    return [
        s
        for s in policy["Statement"]
        if s["Effect"] == "Allow"
        and any(fnmatchcase(action.lower(), a.lower()) for a in s["Action"])
        and any(fnmatchcase(resource, r) for r in s["Resource"])
    ]


def test_every_call_of_the_cli_is_allowed_by_the_policy(
    stack: StackOutputs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    assert main(["iam-policy"]) == 0
    policy = json.loads(capsys.readouterr().out)

    recorder = Recorder()
    recorder.install(monkeypatch)
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")])
    s3 = boto3.client("s3")
    s3.put_object(Bucket=stack.bucket, Key="results/c/s0/manifest.json", Body=b"{}")
    assert main(["plan", str(spec), "--no-pin-check"]) == 0
    assert main(["launch", str(spec)]) == 0
    assert main(["status", "c"]) == 0
    assert main(["status"]) == 0
    main(["fetch", "c", str(tmp_path / "fetched")])  # no tarball yet: status 1, calls made
    ids = [i for r in boto3.client("ec2").describe_instances()["Reservations"]
           for i in r["Instances"]]  # fmt: skip
    boto3.client("ec2").create_tags(  # overdue: cleanup ends it
        Resources=[i["InstanceId"] for i in ids], Tags=[{"Key": TAG_MAX_RUNTIME_H, "Value": "0"}]
    )
    assert main(["cleanup", "--yes"]) == 0
    book = choose_prices("auto")  # what `bench report` asks
    book.on_demand("g6.xlarge", "us-east-1")
    book.spot_paid("g6.xlarge", "us-east-1a", 1.7e9, 1.7e9 + 3600)
    capsys.readouterr()

    region, account = "us-east-1", "123456789012"

    def arn(rest: str) -> str:
        service, resource = rest.split(":", 1)
        return f"arn:aws:{service}:{region}:{account}:{resource}"

    recorded = {(service, operation) for service, operation, _ in recorder.calls}
    assert {
        ("cloudformation", "DescribeStacks"), ("ec2", "RunInstances"),
        ("ec2", "TerminateInstances"), ("ec2", "DescribeInstanceTypeOfferings"),
        ("s3", "PutObject"), ("ssm", "GetParametersByPath"), ("pricing", "GetProducts"),
        ("ec2", "DescribeSpotPriceHistory"), ("iam", "GetRole"),
        ("service-quotas", "GetServiceQuota"),
    } <= recorded  # fmt: skip
    denied = []
    for service, operation, params in recorder.calls:
        for action, resource in _authorized_as(service, operation, params, arn, stack.bucket):
            if service == "ssm" and resource.startswith(arn("ssm:parameter/aws/service/")):
                resource = f"arn:aws:ssm:{region}::parameter" + resource.split("parameter", 1)[1]
            if not _allowing(policy, action, resource):
                denied.append(f"{action} on {resource}")
    assert denied == []


def test_the_policy_is_narrow(stack: StackOutputs, capsys: pytest.CaptureFixture[str]):
    assert main(["iam-policy"]) == 0
    policy = json.loads(capsys.readouterr().out)
    statements = policy["Statement"]
    actions = [a for s in statements for a in s["Action"]]
    assert not [a for a in actions if a == "*" or a.endswith(":*")]
    star = {a for s in statements if "*" in s["Resource"] for a in s["Action"]}
    assert star <= {
        "ec2:DescribeInstances", "ec2:DescribeInstanceTypes",
        "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeSpotPriceHistory",
        "pricing:GetProducts",
    }  # fmt: skip
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["PassTheInstanceRoleToEc2"]["Resource"] == [stack.instance_role_arn]
    assert by_sid["RunOnlyTaggedInstances"]["Condition"] == {
        "Null": {f"aws:RequestTag/{TAG_CAMPAIGN}": "false"}
    }
    assert by_sid["EndOnlyCampaignInstances"]["Condition"] == {
        "Null": {f"aws:ResourceTag/{TAG_CAMPAIGN}": "false"}
    }
    assert "iam:CreateServiceLinkedRole" not in actions
    templates = " ".join(by_sid["RunFromTheStacksTemplatesAndSubnets"]["Resource"])
    every = [t for pair in stack.launch_templates.values() for t in pair.values()]
    assert len(every) == 4 and all(t in templates for t in every)  # both markets, both archs
