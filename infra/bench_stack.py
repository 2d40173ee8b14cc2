"""BenchStack: everything a campaign needs, composed from the constructs beside this module.

`cdk deploy BenchStack` once; `bench launch` after that reads the stack's outputs (keys in
`contract.layout`) and starts instances from the launch templates; `cdk destroy BenchStack`
when done. The stack only declares: no lookups, so synth works offline with no credentials.
"""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import CfnOutput, Environment, Stack
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from contract.gpus import CPU_ARCHITECTURES
from contract.layout import (
    AGENT_ENV_BUCKET,
    AGENT_ENV_HF_SECRET_ID,
    AGENT_ENV_REGION,
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
from infra.agent_asset import AgentAsset
from infra.hf_secret import HfTokenSecret
from infra.identity import InstanceIdentity
from infra.launch_templates import BenchLaunchTemplates
from infra.network import BenchNetwork
from infra.results_bucket import ResultsBucket
from infra.settings import StackSettings
from infra.user_data import render_user_data

__all__ = ["BenchStack"]


class BenchStack(Stack):
    """The benchmark stack.

    Attributes:
        network: VPC, public subnets, security group.
        results: the results bucket.
        hf_token: the (empty) Hugging Face token secret.
        agent_asset: the zipped agent.
        identity: role, instance profile, agent policy.
        launch_templates: CPU architecture -> its spot and on-demand launch templates.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        settings: StackSettings,
        project_root: Path,
        description: str | None = None,
    ) -> None:
        """Declare the stack.

        Args:
            scope: the app.
            id_: the stack name (`contract.layout.STACK_NAME` in app.py).
            settings: checked settings (see `infra.settings`).
            project_root: the folder holding pyproject.toml and the agent's packages.
            description: the CloudFormation stack description.
        """
        # Only the region is fixed (the AZ names belong to it); the account stays unknown at
        # synth, so no lookup can happen and no credentials are needed.
        super().__init__(
            scope, id_, env=Environment(region=settings.region), description=description
        )
        self.network = BenchNetwork(self, "Network", availability_zones=settings.availability_zones)
        self.results = ResultsBucket(self, "Results", keep_on_destroy=settings.keep_results)
        self.hf_token = HfTokenSecret(self, "HfToken")
        self.agent_asset = AgentAsset(self, "AgentAsset", project_root=project_root)
        self.identity = InstanceIdentity(
            self,
            "Identity",
            results_bucket=self.results.bucket,
            hf_secret=self.hf_token.secret,
            agent_asset=self.agent_asset.asset,
        )
        asset = self.agent_asset.asset
        user_data = render_user_data(
            asset_uri=f"s3://{asset.s3_bucket_name}/{asset.s3_object_key}",
            region=self.region,
            max_hours=settings.max_hours,
            agent_env={
                AGENT_ENV_BUCKET: self.results.bucket.bucket_name,
                AGENT_ENV_HF_SECRET_ID: self.hf_token.secret.secret_arn,
                AGENT_ENV_REGION: self.region,
            },
        )
        self.launch_templates = {
            arch: BenchLaunchTemplates(
                self,
                # x86_64 keeps the construct id it had before arm64 templates existed.
                "LaunchTemplates" if arch == "x86_64" else f"LaunchTemplates{arch.title()}",
                instance_type=settings.instance_types.get(arch),
                ami_parameter=settings.ami_parameters[arch],
                root_volume_gib=settings.root_volume_gib,
                security_group=self.network.security_group,
                instance_profile=self.identity.instance_profile,
                user_data=ec2.UserData.custom(user_data),
            )
            for arch in CPU_ARCHITECTURES
        }

        subnets = self.network.subnets_by_az
        outputs: dict[str, tuple[str | None, str]] = {
            OUTPUT_BUCKET: (self.results.bucket.bucket_name, "results bucket"),
            OUTPUT_SUBNETS_BY_AZ: (
                self.to_json_string({az: subnet.subnet_id for az, subnet in subnets.items()}),
                "public subnet id by availability zone (JSON object)",
            ),
            OUTPUT_HF_SECRET_ARN: (
                self.hf_token.secret.secret_arn,
                "secret to put the Hugging Face token in (README)",
            ),
            OUTPUT_STATUS_PREFIX: (STATUS_PARAMETER_PREFIX, "SSM status parameter prefix"),
            OUTPUT_MAX_HOURS: (str(settings.max_hours), "hours after boot an instance powers off"),
            OUTPUT_INSTANCE_ROLE_ARN: (self.identity.role.role_arn, "the instances' role"),
            OUTPUT_AMI_PARAMETERS: (
                json.dumps(dict(settings.ami_parameters), sort_keys=True),
                "SSM parameter naming the AMI, by CPU architecture (JSON object)",
            ),
        }
        for arch, pair in self.launch_templates.items():
            for market, template in (("spot", pair.spot), ("on-demand", pair.on_demand)):
                outputs[launch_template_output(arch, market)] = (
                    template.launch_template_id,
                    f"{market} launch template for {arch} instances",
                )
        for key, (value, text) in outputs.items():
            if value is None:  # launch_template_id is optional in the type, set for ours
                raise ValueError(f"output {key}: no value")
            CfnOutput(self, key, value=value, description=f"Bench: {text}")
