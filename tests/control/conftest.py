"""BenchStack "deployed" into a moto server, and the `bench` CLI run against it.

The stack is the real one: BenchStack synthesized offline with three zones
(us-east-1a/b/c), then created in moto's CloudFormation with the resources moto can build:
the VPC and its three public subnets, the security group, the role and instance profile,
the bucket, the secret, and both launch templates exactly as the template declares them. Left
out are the CDK custom resources and their Lambdas (moto would have to run them), the IAM
policy and the bucket policy (moto rejects the CDK asset-bucket ARNs in them; nothing here
tests permissions). The outputs, `SubnetIdsByAz` included, are resolved by moto from the
template's own `Ref`/`Fn::Join`, so `describe_stacks` returns what a real deploy would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from contract.layout import STACK_NAME, status_parameter_name
from contract.status import ShardStatus
from control.aws import AwsClients
from control.stack import StackOutputs, find_stack
from tests.fixtures.moto_server import MotoServer

BENCH = str(Path(sys.executable).with_name("bench"))
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
# Resource types moto cannot create from this template (see the module docstring).
_LEFT_OUT = ("Custom::", "AWS::Lambda::", "AWS::IAM::Policy", "AWS::S3::BucketPolicy")


@pytest.fixture(scope="session")
def moto_template(synth_with: Callable[..., Any]) -> dict[str, Any]:
    """BenchStack's template (three zones), less what moto cannot create."""
    template = synth_with(azs=",".join(ZONES)).template_json
    resources = {
        name: resource
        for name, resource in template["Resources"].items()
        if not resource["Type"].startswith(_LEFT_OUT) and "CustomResourceProvider" not in name
    }
    kinds = {r["Type"] for r in resources.values()}
    assert {"AWS::EC2::LaunchTemplate", "AWS::EC2::Subnet", "AWS::S3::Bucket"} <= kinds
    return {"Resources": resources, "Outputs": template["Outputs"]}


@pytest.fixture
def stack(aws: MotoServer, moto_template: dict[str, Any]) -> StackOutputs:
    """A clean moto account with BenchStack created in it; its outputs."""
    cfn = boto3.client("cloudformation")
    cfn.create_stack(StackName=STACK_NAME, TemplateBody=json.dumps(moto_template))
    return find_stack(AwsClients.from_environment(), STACK_NAME)


@pytest.fixture
def clients(stack: StackOutputs) -> AwsClients:
    """Fresh clients (so monkeypatched environment settings apply to them)."""
    return AwsClients.from_environment()


def run_bench(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout_s: float = 120,
) -> subprocess.CompletedProcess[str]:
    """The real `bench` console script, with this process's (moto) environment."""
    return subprocess.run(
        [BENCH, *args],
        capture_output=True,
        text=True,
        input=stdin if stdin is not None else "",
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "250", **(env or {})},
    )


def write_spec(
    path: Path,
    name: str,
    shards: Sequence[tuple[str, str]],
    max_runtime_h: float = 6,
    arms: Sequence[str] = ("llama",),
) -> Path:
    """A valid campaign spec (contract.spec) with these shards, each running `arms`."""
    lines = [
        f'name = "{name}"',
        f"max_runtime_h = {max_runtime_h}",
        "",
        "[model]",
        'name = "m"',
        'sources = { default = "org/model" }',
        "",
    ]
    for shard, instance_type in shards:
        lines += [
            "[[shards]]",
            f'name = "{shard}"',
            f'instance_type = "{instance_type}"',
            f"arms = {json.dumps(list(arms))}",
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def live_instances(campaign: str | None = None) -> list[dict[str, Any]]:
    """Pending or running instances (of a campaign, or tagged with any)."""
    tag = (
        {"Name": "tag:bench:campaign", "Values": [campaign]}
        if campaign
        else {"Name": "tag-key", "Values": ["bench:campaign"]}
    )
    reservations = boto3.client("ec2").describe_instances(
        Filters=[tag, {"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def put_status(campaign: str, shard: str, **fields: Any) -> None:
    """Publish a status the way the agent does (the contract's own record)."""
    now = datetime.now(UTC)
    record = ShardStatus(
        campaign=campaign,
        shard=shard,
        started_at=fields.pop("started_at", now),
        updated_at=fields.pop("updated_at", now),
        **fields,
    )
    boto3.client("ssm").put_parameter(
        Name=status_parameter_name(campaign, shard),
        Value=record.to_parameter_value(),
        Type="String",
        Overwrite=True,
    )


# --- errors injected at the HTTP layer of a boto3 client ---


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def ec2_error_response(code: str, status: int, message: str = "injected") -> AWSResponse:
    """An EC2 (query protocol) error response, as the service sends it."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        "<RequestID>00000000-test</RequestID></Response>"
    ).encode()
    return AWSResponse("https://ec2.us-east-1.amazonaws.com/", status, {}, _Raw(body))


@dataclass
class Sent:
    """One RunInstances request that reached the HTTP layer."""

    market: str
    zone: str
    subnet: str


class RunInstancesScript:
    """Answers RunInstances requests by (market, zone) from a script; others reach moto.

    Hooked on `before-send`, below botocore's retry handler: every HTTP request is seen,
    so a retry by botocore itself would show up as a second `Sent` for the same attempt.
    """

    def __init__(self, stack: StackOutputs, script: dict[tuple[str, str], list[tuple[str, int]]]):
        self._markets = {
            template: market
            for pair in stack.launch_templates.values()
            for market, template in pair.items()
        }
        self._zones = {subnet: zone for zone, subnet in stack.subnets_by_az.items()}
        self._script = {key: list(errors) for key, errors in script.items()}
        self.sent: list[Sent] = []

    def install(self, client: Any) -> RunInstancesScript:
        client.meta.events.register("before-send.ec2.RunInstances", self)
        return self

    def __call__(self, request: Any, **_: Any) -> AWSResponse | None:
        body = request.body.decode() if isinstance(request.body, bytes) else request.body
        params = {k: v[0] for k, v in parse_qs(body).items()}
        subnet = params["SubnetId"]
        sent = Sent(
            self._markets[params["LaunchTemplate.LaunchTemplateId"]], self._zones[subnet], subnet
        )
        self.sent.append(sent)
        queue = self._script.get((sent.market, sent.zone))
        if queue:
            code, status = queue.pop(0)
            return ec2_error_response(code, status)
        return None  # let moto answer


def count_sends(client: Any, event: str) -> list[int]:
    """Count HTTP sends of one operation (`before-send.ec2.X`); returns the live counter."""
    counter = [0]

    def hook(**_: Any) -> None:
        counter[0] += 1

    client.meta.events.register(event, hook)
    return counter
