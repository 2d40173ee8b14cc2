"""BenchStack's outputs, found by stack name (CloudFormation DescribeStacks).

The output keys are `contract.layout`'s; `infra/bench_stack.py` declares them. A stack that is
missing, still being created, rolled back, or lacking an output is a `ControlError` naming
what to do; so is a `--bucket` that is not the stack's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from contract.gpus import CPU_ARCHITECTURES
from contract.layout import (
    OUTPUT_AMI_PARAMETERS,
    OUTPUT_BUCKET,
    OUTPUT_HF_SECRET_ARN,
    OUTPUT_INSTANCE_ROLE_ARN,
    OUTPUT_MAX_HOURS,
    OUTPUT_STATUS_PREFIX,
    OUTPUT_SUBNETS_BY_AZ,
    STATUS_PARAMETER_PREFIX,
    launch_template_output,
)
from contract.status import Market
from control.aws import AwsClients
from control.errors import ControlError

__all__ = ["StackOutputs", "check_bucket", "find_stack", "results_bucket"]

# Stack states in which the outputs describe resources that exist.
_USABLE_STATES = frozenset(
    {"CREATE_COMPLETE", "UPDATE_COMPLETE", "UPDATE_ROLLBACK_COMPLETE", "IMPORT_COMPLETE"}
)
_DEPLOY_HINT = "deploy it with `make deploy` (cdk deploy BenchStack)"


@dataclass(frozen=True, slots=True)
class StackOutputs:
    """What the control plane needs from BenchStack.

    Attributes:
        stack_name: the stack's name.
        bucket: the results bucket (campaign specs and results).
        launch_templates: CPU architecture -> market -> launch template id (a stack deployed
            before arm64 templates existed has x86_64 only).
        subnets_by_az: zone name -> public subnet id, in the stack's zone order.
        status_prefix: the SSM path the agents publish status under (`/bench/`).
        hf_secret_arn: the Hugging Face token secret (None: a stack without the output).
        max_hours: the instances' power-off backstop (None: a stack deployed before it was
            an output).
        instance_role_arn: the instances' role (None: likewise).
        ami_parameters: CPU architecture -> the SSM parameter its launch templates resolve
            (empty: likewise).
    """

    stack_name: str
    bucket: str
    launch_templates: Mapping[str, Mapping[Market, str]]
    subnets_by_az: Mapping[str, str]
    status_prefix: str
    hf_secret_arn: str | None = None
    max_hours: int | None = None
    instance_role_arn: str | None = None
    ami_parameters: Mapping[str, str] = field(default_factory=dict)

    @property
    def spot_launch_templates(self) -> frozenset[str]:
        """Every spot template's id (an instance launched from one is a spot instance)."""
        return frozenset(pair["spot"] for pair in self.launch_templates.values())

    def launch_template(self, cpu_arch: str, market: Market) -> str:
        """The template for instances of this architecture on this market.

        Raises:
            ControlError: the stack has no templates for the architecture.
        """
        pair = self.launch_templates.get(cpu_arch)
        if pair is None:
            raise ControlError(
                f"stack {self.stack_name} has no launch templates for {cpu_arch} instances "
                f"(it has {', '.join(sorted(self.launch_templates)) or 'none'}); redeploy it "
                f"from this project ({_DEPLOY_HINT.removeprefix('deploy it with ')})"
            )
        return pair[market]


def find_stack(clients: AwsClients, stack_name: str, *, bucket: str | None = None) -> StackOutputs:
    """Read the stack's outputs.

    Args:
        clients: the AWS clients.
        stack_name: the stack's name (`contract.layout.STACK_NAME` unless overridden).
        bucket: a bucket the user named; it must be the stack's.

    Raises:
        ControlError: no such stack, not in a usable state, an output missing or malformed,
            or `bucket` is not the stack's.
    """
    cfn = clients.client("cloudformation")
    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ValidationError":
            raise ControlError(
                f"stack {stack_name} not found in {clients.region}: {_DEPLOY_HINT}, "
                "or pass --stack / set AWS_REGION"
            ) from exc
        raise
    if not stacks:
        raise ControlError(f"stack {stack_name} not found in {clients.region}: {_DEPLOY_HINT}")
    stack = stacks[0]
    state = stack.get("StackStatus", "")
    if state not in _USABLE_STATES:
        raise ControlError(
            f"stack {stack_name} is {state}, not deployed; wait for it or {_DEPLOY_HINT}"
        )
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}

    def need(key: str) -> str:
        value = outputs.get(key, "")
        if not value:
            raise ControlError(
                f"stack {stack_name} has no output {key}: it was not deployed from this "
                f"project's BenchStack; {_DEPLOY_HINT}"
            )
        return value

    try:
        subnets = json.loads(need(OUTPUT_SUBNETS_BY_AZ))
    except json.JSONDecodeError as exc:
        raise ControlError(
            f"stack {stack_name}: output {OUTPUT_SUBNETS_BY_AZ} is not JSON"
        ) from exc
    if not isinstance(subnets, dict) or not subnets:
        raise ControlError(f"stack {stack_name}: output {OUTPUT_SUBNETS_BY_AZ} names no subnet")
    templates: dict[str, dict[Market, str]] = {}
    for arch in CPU_ARCHITECTURES:
        spot = outputs.get(launch_template_output(arch, "spot"), "")
        on_demand = outputs.get(launch_template_output(arch, "on-demand"), "")
        if spot and on_demand:
            templates[arch] = {"spot": spot, "on-demand": on_demand}
    if not templates:
        need(launch_template_output(CPU_ARCHITECTURES[0], "spot"))
    found = StackOutputs(
        stack_name=stack_name,
        bucket=need(OUTPUT_BUCKET),
        launch_templates=templates,
        subnets_by_az={str(az): str(subnet) for az, subnet in subnets.items()},
        status_prefix=outputs.get(OUTPUT_STATUS_PREFIX) or STATUS_PARAMETER_PREFIX,
        hf_secret_arn=outputs.get(OUTPUT_HF_SECRET_ARN) or None,
        max_hours=_int_or_none(outputs.get(OUTPUT_MAX_HOURS)),
        instance_role_arn=outputs.get(OUTPUT_INSTANCE_ROLE_ARN) or None,
        ami_parameters=_json_object(outputs.get(OUTPUT_AMI_PARAMETERS)),
    )
    if bucket is not None and bucket != found.bucket:
        raise ControlError(
            f"--bucket {bucket} is not stack {stack_name}'s results bucket ({found.bucket}); "
            "leave --bucket out to use the stack's"
        )
    return found


def results_bucket(clients: AwsClients, stack_name: str, *, bucket: str | None = None) -> str:
    """The bucket to read results from: the stack's, or `bucket` when no stack is deployed.

    A bucket kept after `cdk destroy` (`-c keep_results=true`) outlives its stack; naming it
    with `--bucket` reads it. With a stack deployed, `bucket` must be the stack's.

    Raises:
        ControlError: no stack and no bucket; a bucket that is not the stack's; a bucket that
            does not exist or cannot be read.
    """
    try:
        name = find_stack(clients, stack_name, bucket=bucket).bucket
    except ControlError:
        if bucket is None or _stack_exists(clients, stack_name):
            raise
        name = bucket
    check_bucket(clients, name)
    return name


def check_bucket(clients: AwsClients, name: str) -> None:
    """Raise `ControlError` unless the bucket exists and these credentials can reach it."""
    s3 = clients.client("s3")
    try:
        s3.head_bucket(Bucket=name)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in {"404", "NoSuchBucket", "NotFound"}:
            raise ControlError(f"bucket {name} does not exist (deleted with its stack?)") from exc
        if code in {"403", "AccessDenied", "Forbidden"}:
            raise ControlError(f"bucket {name}: access denied to these credentials") from exc
        raise


def _json_object(text: str | None) -> dict[str, str]:
    """A JSON object output as strings; empty when absent or not an object (an older stack)."""
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _stack_exists(clients: AwsClients, stack_name: str) -> bool:
    try:
        clients.client("cloudformation").describe_stacks(StackName=stack_name)
    except ClientError:
        return False
    return True
