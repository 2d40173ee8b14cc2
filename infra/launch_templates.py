"""Launch templates: one spot (one-time, terminate on interruption), one on-demand; else identical.

The stack declares one such pair per CPU architecture (x86_64 and arm64, contract.gpus), each
on its architecture's AMI: a template resolves one AMI, and the launcher picks the pair by
the shard's GPU family.

Both come from one set of arguments, so they cannot drift apart:

- the AMI from its public SSM parameter, resolved at every launch (`resolve:ssm:`), so a new
  DLAMI release is picked up without a redeploy;
- IMDSv2 required, hop limit 1 (containers on a bridge network cannot reach the instance's
  credentials), instance tags in metadata (the agent reads `bench:campaign` there);
- an encrypted gp3 root volume, sized and provisioned for model loads: seed 002 measured
  ~21 MiB/s first-touch reads on a default gp3 root restored from a snapshot, so throughput
  and IOPS are raised and the volume initialization rate is set, which hydrates the AMI
  snapshot at a fixed rate instead of block by block on first read;
- shutdown behaviour terminate (an instance that powers off is gone, billing stops);
- the instance profile, the security group, the user data, and one Name tag;
- a default instance type, which a campaign overrides at launch.

No subnet and no key pair: the launcher picks a subnet per attempt, and access is SSM only.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Size, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

__all__ = ["BenchLaunchTemplates"]

ROOT_DEVICE = "/dev/sda1"  # Ubuntu AMIs, the DLAMI included
ROOT_IOPS = 6000  # gp3 baseline 3000; 1000 MiB/s of 256 KiB reads needs 4000
ROOT_THROUGHPUT_MIBPS = 1000  # gp3 baseline 125 MiB/s, the bottleneck seed 002 hit
ROOT_INIT_RATE_MIBPS = 300  # the maximum provisioned volume initialization rate
# Name tag of instances and volumes from either template (CDK would use the construct path,
# which differs between the two); the launcher's own tags may add to or replace it.
NAME_TAG = "bench-gpu"


class BenchLaunchTemplates(Construct):
    """The spot and on-demand launch templates.

    Attributes:
        spot: spot, one-time request, terminate on interruption.
        on_demand: on-demand.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        instance_type: str | None,
        ami_parameter: str,
        root_volume_gib: int,
        security_group: ec2.ISecurityGroup,
        instance_profile: iam.IInstanceProfile,
        user_data: ec2.UserData,
    ) -> None:
        """Declare both templates.

        Args:
            scope: parent construct.
            id_: construct id.
            instance_type: default instance type (e.g. g6.xlarge), or None; launches set it.
            ami_parameter: public SSM parameter holding the AMI id.
            root_volume_gib: root volume size.
            security_group: the instances' security group.
            instance_profile: the instances' profile.
            user_data: the bootstrap script.
        """
        super().__init__(scope, id_)
        # Any: the same props go to both templates; CDK checks them at synth.
        common: dict[str, Any] = {
            "instance_type": ec2.InstanceType(instance_type) if instance_type else None,
            "machine_image": ec2.MachineImage.resolve_ssm_parameter_at_launch(
                ami_parameter, os=ec2.OperatingSystemType.LINUX
            ),
            "require_imdsv2": True,
            "http_tokens": ec2.LaunchTemplateHttpTokens.REQUIRED,
            "http_endpoint": True,
            "http_put_response_hop_limit": 1,
            "instance_metadata_tags": True,
            "block_devices": [
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        delete_on_termination=True,
                        iops=ROOT_IOPS,
                        throughput=ROOT_THROUGHPUT_MIBPS,
                        volume_initialization_rate=Size.mebibytes(ROOT_INIT_RATE_MIBPS),
                    ),
                )
            ],
            "instance_initiated_shutdown_behavior": ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
            "instance_profile": instance_profile,
            "security_group": security_group,
            "user_data": user_data,
        }
        self.on_demand = ec2.LaunchTemplate(self, "OnDemand", **common)
        self.spot = ec2.LaunchTemplate(
            self,
            "Spot",
            spot_options=ec2.LaunchTemplateSpotOptions(
                request_type=ec2.SpotRequestType.ONE_TIME,
                interruption_behavior=ec2.SpotInstanceInterruption.TERMINATE,
            ),
            **common,
        )
        for template in (self.on_demand, self.spot):
            Tags.of(template).add("Name", NAME_TAG)
