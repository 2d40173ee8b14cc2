"""Pre-launch checks: can this campaign launch, and run to its end, in this account?

`bench launch` runs them before its first RunInstances and launches nothing if any fails;
`bench plan` runs them when credentials exist. Each problem is one line saying what to do:

- the stack: deployed and usable (`control.stack.find_stack`);
- vCPU quotas: every shard runs at once, so the campaign's vCPUs per family group against
  the spot and the on-demand quota (seed 002 was held to two instances by 16 vCPUs);
  a problem only when neither market covers it;
- zones: each shard's type offered in some zone of the stack's subnets;
- the Hugging Face token secret holds a value (DescribeSecret: its current version; the
  token itself is never read here), unless the user says every source is public;
- the spot service-linked role `AWSServiceRoleForEC2Spot` (a fresh account refuses spot
  requests through the API until it exists): a warning with the command that creates it,
  not a problem: the launcher then goes on with on-demand;
- `max_runtime_h` against the stack's `MaxHours` backstop (the user data powers an instance
  off that long after boot, with no status).

Checks that cannot be read (a permission missing) are notes, not problems: the launch's own
error handling still covers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from contract.spec import CampaignSpec
from control.aws import AwsClients
from control.errors import ControlError
from control.quotas import quota_checks, quota_problem
from control.stack import StackOutputs, find_stack

__all__ = [
    "SPOT_ROLE_COMMAND",
    "SPOT_ROLE_NAME",
    "Preflight",
    "check_stack_fit",
    "preflight",
]

SPOT_ROLE_NAME = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_COMMAND = "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"


@dataclass
class Preflight:
    """What the checks found.

    Attributes:
        problems: one line each; any problem means nothing is launched.
        warnings: one line each; the launch goes on (e.g. no spot role: on-demand only).
        notes: what was checked, or could not be.
        stack: the stack's outputs (None if it is not deployed).
        zones: the stack's zones (None if unknown).
    """

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stack: StackOutputs | None = None
    zones: list[str] | None = None


def preflight(
    clients: AwsClients,
    stack_name: str,
    spec: CampaignSpec,
    *,
    public_sources: bool = False,
    stack: StackOutputs | None = None,
) -> Preflight:
    """Run every check; never raises for what it finds.

    Args:
        clients: the AWS clients.
        stack_name: the stack to launch through.
        spec: the checked campaign spec.
        public_sources: the user says every model source is public (no token needed).
        stack: the stack's outputs, when the caller has read them already.
    """
    found = Preflight()
    if stack is None:
        try:
            stack = find_stack(clients, stack_name)
        except ControlError as exc:
            found.problems.append(str(exc))
    found.stack = stack
    _quotas(clients, spec, found)
    if stack is not None:
        found.zones = list(stack.subnets_by_az)
        _zones(clients, stack, spec, found)
        _secret(clients, stack, public_sources, found)
        found.problems.extend(check_stack_fit(stack, spec))
        if stack.max_hours is None:
            found.notes.append(
                f"stack {stack.stack_name} has no MaxHours output (deployed by an older "
                "version): the max_runtime_h backstop was not checked; redeploy to check it"
            )
    _spot_role(clients, found)
    return found


def check_stack_fit(stack: StackOutputs, spec: CampaignSpec) -> list[str]:
    """The spec's runtime against the stack's power-off backstop."""
    if stack.max_hours is None or spec.max_runtime_h <= stack.max_hours:
        return []
    return [
        f"max_runtime_h {spec.max_runtime_h:g} is beyond stack {stack.stack_name}'s backstop: "
        f"its instances power off {stack.max_hours} h after boot, with no status; lower "
        f"max_runtime_h, or redeploy with make deploy CDK_ARGS=\"-c max_hours="
        f"{int(-(-spec.max_runtime_h // 1))}\""
    ]


def _quotas(clients: AwsClients, spec: CampaignSpec, found: Preflight) -> None:
    try:
        checks = quota_checks(clients, spec)
    except ControlError as exc:
        found.problems.append(str(exc))
        return
    except (ClientError, BotoCoreError) as exc:
        found.notes.append(f"vCPU quotas not checked: {_short(exc)}")
        return
    for spot, on_demand in zip(checks[::2], checks[1::2], strict=True):
        problem = quota_problem(spot, on_demand)
        if problem is not None:
            found.problems.append(problem)
            continue
        for check in (spot, on_demand):
            head = (
                f"quota {check.group.name} {check.market} ({check.quota_code}): "
                f"{check.needed_vcpus} vCPUs needed at once"
            )
            if check.quota_vcpus is None:
                found.notes.append(f"{head}; not readable ({check.note})")
            elif check.ok:
                found.notes.append(f"{head}, quota {check.quota_vcpus:g}: ok")
            else:
                then = "spot is refused, on-demand used" if check.market == "spot" else (
                    "on-demand is refused; spot only"
                )
                found.warnings.append(
                    f"{head}, quota {check.quota_vcpus:g}: too low ({then})"
                )


def _zones(clients: AwsClients, stack: StackOutputs, spec: CampaignSpec, found: Preflight) -> None:
    ec2: Any = clients.client("ec2")
    for instance_type in sorted({s.instance_type for s in spec.shards}):
        try:
            offered = {
                offering["Location"]
                for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                )
                for offering in page.get("InstanceTypeOfferings", [])
            }
        except (ClientError, BotoCoreError) as exc:
            found.notes.append(f"zones offering {instance_type} not checked: {_short(exc)}")
            continue
        mine = [az for az in stack.subnets_by_az if az in offered]
        if mine:
            found.notes.append(f"{instance_type}: offered in {', '.join(mine)} of the stack")
            continue
        where = f"only in {', '.join(sorted(offered))}" if offered else "in no zone"
        found.problems.append(
            f"instance type {instance_type} is offered in none of the stack's zones "
            f"({', '.join(stack.subnets_by_az)}) but {where} of {clients.region}; redeploy "
            "with those zones (make deploy CDK_ARGS=\"-c azs=...\") or pick another type"
        )


def _secret(
    clients: AwsClients, stack: StackOutputs, public_sources: bool, found: Preflight
) -> None:
    if stack.hf_secret_arn is None:
        found.notes.append("the stack names no HF-token secret: not checked")
        return
    try:
        secret = clients.client("secretsmanager").describe_secret(SecretId=stack.hf_secret_arn)
    except (ClientError, BotoCoreError) as exc:
        found.notes.append(f"HF-token secret not checked: {_short(exc)}")
        return
    stages = secret.get("VersionIdsToStages") or {}
    if any("AWSCURRENT" in labels for labels in stages.values()):
        found.notes.append("HF-token secret: has a value")
        return
    if public_sources:
        found.notes.append("HF-token secret: empty; every source said to be public")
        return
    found.problems.append(
        f"the HF-token secret ({stack.hf_secret_arn}) is empty and gated sources (Gemma) need "
        "a token: store it as the README's 'Campaigns on AWS' says (put-secret-value from "
        "stdin), or pass --public-sources if every source is public"
    )


def _spot_role(clients: AwsClients, found: Preflight) -> None:
    try:
        clients.client("iam").get_role(RoleName=SPOT_ROLE_NAME)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "NoSuchEntity":
            found.warnings.append(
                f"no spot service-linked role ({SPOT_ROLE_NAME}): spot requests through the "
                f"API fail until it exists, and the launch goes on with on-demand; create it "
                f"once with: {SPOT_ROLE_COMMAND}"
            )
            return
        found.notes.append(f"spot service-linked role not checked: {_short(exc)}")
    except BotoCoreError as exc:
        found.notes.append(f"spot service-linked role not checked: {_short(exc)}")
    else:
        found.notes.append(f"spot service-linked role {SPOT_ROLE_NAME}: exists")


def _short(exc: BaseException, limit: int = 160) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        text = f"{error.get('Code', 'Error')}: {error.get('Message', '')}"
    else:
        text = str(exc)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
