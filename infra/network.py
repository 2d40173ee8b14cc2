"""Network: a VPC of public subnets only, one per AZ, no NAT, an S3 gateway endpoint, a closed SG.

Instances get a public address from their subnet (MapPublicIpOnLaunch) and reach SSM, S3,
Secrets Manager, Hugging Face and package indexes outbound; nothing reaches them inbound:
the security group has no ingress rule, there is no key pair, and shell access is SSM Session
Manager only. No NAT gateway (no hourly or per-GB charge); S3 traffic (results, the agent
asset) goes through the free gateway endpoint instead of the internet gateway.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

__all__ = ["BenchNetwork"]

VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDR_MASK = 20  # 4091 addresses per AZ, 16 AZs fit the /16


class BenchNetwork(Construct):
    """The VPC, its public subnets and the instances' security group.

    Attributes:
        vpc: the VPC.
        subnets_by_az: AZ name -> the public subnet in it, in the order the AZs were given.
        security_group: the instances' security group: all egress, no ingress.
    """

    def __init__(self, scope: Construct, id_: str, *, availability_zones: Sequence[str]) -> None:
        """Declare the network.

        Args:
            scope: parent construct.
            id_: construct id.
            availability_zones: AZ names (no lookups: synth stays offline); one subnet each.
        """
        super().__init__(scope, id_)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            availability_zones=list(availability_zones),
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="public",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=SUBNET_CIDR_MASK,
                    map_public_ip_on_launch=True,
                )
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)
            },
        )
        self.subnets_by_az: dict[str, ec2.ISubnet] = {
            subnet.availability_zone: subnet for subnet in self.vpc.public_subnets
        }
        self.security_group = ec2.SecurityGroup(
            self,
            "InstanceSecurityGroup",
            vpc=self.vpc,
            description="Bench GPU instances: no inbound (access is SSM only), all outbound",
            allow_all_outbound=True,
        )
        Validations.of(self.vpc).acknowledge(
            Acknowledgment(
                id="AwsSolutions-VPC7",
                reason="Nothing can connect in (the only security group has no ingress rule, "
                "no key pair exists, access is SSM Session Manager, which CloudTrail logs); the "
                "VPC holds short-lived benchmark instances only. Flow logs would bill CloudWatch "
                "per campaign for traffic nobody reviews; add them if your account requires it.",
            )
        )
