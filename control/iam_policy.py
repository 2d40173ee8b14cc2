"""`bench iam-policy`: the least-privilege IAM policy a workstation user needs for `bench
plan|launch|status|fetch|cleanup|report`, derived from BenchStack's outputs.

What each statement is for, and why it is scoped as it is:

- read the stack's outputs (CloudFormation DescribeStacks on this stack only);
- EC2 describes, which IAM cannot scope to a resource (instances, types, offerings, the
  spot price history);
- RunInstances: only with the stack's two launch templates, in the stack's subnets, and only
  creating instances and volumes that carry a `bench:campaign` tag in the request; tags only
  as part of that RunInstances (`ec2:CreateAction`); TerminateInstances only on instances
  tagged `bench:campaign` (cleanup);
- `iam:PassRole` on the instances' role only, to EC2 only;
- `ssm:GetParameters` on the public AMI parameter the launch templates resolve at launch;
- the campaigns' SSM status parameters (read, and delete for cleanup) and the bucket's
  `campaigns/` (spec upload) and `results/` (fetch) prefixes;
- Service Quotas reads of the four GPU vCPU quotas, the Price List, DescribeSecret on the
  HF-token secret (has it a value? its value is never read) and GetRole on the spot
  service-linked role (pre-launch checks).

Creating the spot service-linked role is left out: it is done once, by an administrator.
"""

from __future__ import annotations

import json
from typing import Any

from contract.layout import CAMPAIGNS_PREFIX, RESULTS_PREFIX, TAG_CAMPAIGN
from control.errors import ControlError
from control.preflight import SPOT_ROLE_NAME
from control.quotas import G_AND_VT, P
from control.stack import StackOutputs

__all__ = ["workstation_policy", "workstation_policy_json"]


def workstation_policy(stack: StackOutputs, region: str) -> dict[str, Any]:
    """The policy document for this stack in `region`.

    Raises:
        ControlError: the stack lacks an output the policy is derived from (an older stack:
            redeploy it).
    """
    role = stack.instance_role_arn
    if role is None or not stack.ami_parameters:
        raise ControlError(
            f"stack {stack.stack_name} has no InstanceRoleArn/AmiParameters outputs (deployed "
            "by an older version): redeploy it with `make deploy`, then run this again"
        )
    parts = role.split(":")
    partition, account = parts[1], parts[4]
    ec2 = f"arn:{partition}:ec2:{region}:{account}"
    ssm = f"arn:{partition}:ssm:{region}:{account}:parameter"
    bucket = f"arn:{partition}:s3:::{stack.bucket}"
    prefix = stack.status_prefix.strip("/")
    tagged = {"Null": {f"aws:RequestTag/{TAG_CAMPAIGN}": "false"}}
    statements: list[dict[str, Any]] = [
        _allow(
            "ReadTheStack",
            ["cloudformation:DescribeStacks"],
            [f"arn:{partition}:cloudformation:{region}:{account}:stack/{stack.stack_name}/*"],
        ),
        _allow(
            "Ec2DescribesHaveNoResourceScope",
            [
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeSpotPriceHistory",
            ],
            ["*"],
        ),
        _allow(
            "RunFromTheStacksTemplatesAndSubnets",
            ["ec2:RunInstances"],
            [
                *(
                    f"{ec2}:launch-template/{template}"
                    for pair in stack.launch_templates.values()
                    for template in pair.values()
                ),
                *(f"{ec2}:subnet/{subnet}" for subnet in stack.subnets_by_az.values()),
                f"{ec2}:security-group/*",
                f"{ec2}:network-interface/*",
                f"{ec2}:spot-instances-request/*",
                f"arn:{partition}:ec2:{region}::image/*",
            ],
        ),
        _allow(
            "RunOnlyTaggedInstances",
            ["ec2:RunInstances"],
            [f"{ec2}:instance/*", f"{ec2}:volume/*"],
            tagged,
        ),
        _allow(
            "TagOnlyAtLaunch",
            ["ec2:CreateTags"],
            [f"{ec2}:instance/*", f"{ec2}:volume/*"],
            {"StringEquals": {"ec2:CreateAction": "RunInstances"}},
        ),
        _allow(
            "EndOnlyCampaignInstances",
            ["ec2:TerminateInstances"],
            [f"{ec2}:instance/*"],
            {"Null": {f"aws:ResourceTag/{TAG_CAMPAIGN}": "false"}},
        ),
        _allow(
            "PassTheInstanceRoleToEc2",
            ["iam:PassRole"],
            [role],
            {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
        ),
        _allow(
            "ResolveTheAmiParameters",
            ["ssm:GetParameters", "ssm:GetParameter"],
            [
                f"arn:{partition}:ssm:{region}::parameter{name}"
                for name in sorted(stack.ami_parameters.values())
            ],
        ),
        _allow(
            "CampaignStatus",
            [
                "ssm:GetParametersByPath",
                "ssm:GetParameters",
                "ssm:GetParameter",
                "ssm:DeleteParameters",
                "ssm:DeleteParameter",
            ],
            [f"{ssm}/{prefix}", f"{ssm}/{prefix}/*"],
        ),
        _allow(
            "ListTheCampaignPrefixes",
            ["s3:ListBucket"],
            [bucket],
        ),
        _allow(
            "SpecsAndResults",
            ["s3:GetObject"],
            [f"{bucket}/{CAMPAIGNS_PREFIX}*", f"{bucket}/{RESULTS_PREFIX}*"],
        ),
        _allow("UploadSpecs", ["s3:PutObject"], [f"{bucket}/{CAMPAIGNS_PREFIX}*"]),
        _allow(
            "GpuQuotas",
            ["servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"],
            [
                f"arn:{partition}:servicequotas:{region}:{account}:ec2/{code}"
                for group in (G_AND_VT, P)
                for code in (group.on_demand, group.spot)
            ]
            + [
                f"arn:{partition}:servicequotas:{region}::ec2/{code}"
                for group in (G_AND_VT, P)
                for code in (group.on_demand, group.spot)
            ],
        ),
        _allow("PriceListHasNoResourceScope", ["pricing:GetProducts"], ["*"]),
        _allow(
            "SpotRoleExists",
            ["iam:GetRole"],
            [
                f"arn:{partition}:iam::{account}:role/aws-service-role/spot.amazonaws.com/"
                f"{SPOT_ROLE_NAME}"
            ],
        ),
    ]
    if stack.hf_secret_arn is not None:
        statements.append(
            _allow("HfSecretHasAValue", ["secretsmanager:DescribeSecret"], [stack.hf_secret_arn])
        )
    return {"Version": "2012-10-17", "Statement": statements}


def workstation_policy_json(stack: StackOutputs, region: str) -> str:
    """The policy as `aws iam create-policy --policy-document` takes it."""
    return json.dumps(workstation_policy(stack, region), indent=2)


def _allow(
    sid: str,
    actions: list[str],
    resources: list[str],
    condition: dict[str, Any] | None = None,
) -> dict[str, Any]:
    statement: dict[str, Any] = {
        "Sid": sid,
        "Effect": "Allow",
        "Action": actions,
        "Resource": resources,
    }
    if condition:
        statement["Condition"] = condition
    return statement
