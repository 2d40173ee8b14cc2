"""Identity: the instances' role and instance profile, and exactly what the agent may do.

Besides `AmazonSSMManagedInstanceCore` (Session Manager, Run Command; no SSH anywhere), the
agent policy allows:

- reading the one HF-token secret;
- reading the agent asset object (the exact key, not the asset bucket);
- reading and writing objects under `campaigns/` and `results/` of the results bucket, and
  listing only those prefixes;
- putting and getting SSM parameters under `/bench/` (its status).

Nothing on EC2: the agent reads its own tags from IMDS (the launch templates put them in the
metadata) and ends its instance by powering off, which the launch templates turn into
termination; so no instance can read or end another (or another campaign's). No statement
has Resource `*`; the wildcards left are for names that do not exist at deploy time, each
acknowledged for cdk-nag next to the statement, with the reason.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from contract.layout import CAMPAIGNS_PREFIX, RESULTS_PREFIX, STATUS_PARAMETER_PREFIX

__all__ = ["InstanceIdentity"]

SSM_CORE_POLICY = "AmazonSSMManagedInstanceCore"


class InstanceIdentity(Construct):
    """The bench instances' role, instance profile and agent policy.

    Attributes:
        role: the role the instances assume (principal ec2.amazonaws.com).
        instance_profile: the instance profile the launch templates name.
        policy: the agent's own permissions, attached to `role`.
    """

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        results_bucket: s3.IBucket,
        hf_secret: secretsmanager.ISecret,
        agent_asset: s3_assets.Asset,
    ) -> None:
        """Declare the role, its profile and its policy.

        Args:
            scope: parent construct.
            id_: construct id.
            results_bucket: the bucket whose campaign and results prefixes the agent uses.
            hf_secret: the secret holding the Hugging Face token.
            agent_asset: the asset the user data downloads.
        """
        super().__init__(scope, id_)
        stack = Stack.of(self)
        ssm_core = iam.ManagedPolicy.from_aws_managed_policy_name(SSM_CORE_POLICY)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="Bench GPU instances: SSM management plus the bench agent's needs",
            managed_policies=[ssm_core],
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)

        prefixes = (CAMPAIGNS_PREFIX, RESULTS_PREFIX)
        object_arns = [results_bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes]
        status_parameters_arn = stack.format_arn(
            service="ssm",
            resource="parameter",
            resource_name=f"{STATUS_PARAMETER_PREFIX.strip('/')}/*",
        )
        asset_object_arn = agent_asset.bucket.arn_for_objects(agent_asset.s3_object_key)

        self.policy = iam.Policy(
            self,
            "AgentPolicy",
            roles=[self.role],
            statements=[
                iam.PolicyStatement(
                    sid="ReadHfToken",
                    actions=["secretsmanager:GetSecretValue"],
                    resources=[hf_secret.secret_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadAgentAsset",
                    actions=["s3:GetObject"],
                    resources=[asset_object_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadWriteCampaignsAndResults",
                    actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                    resources=object_arns,
                ),
                iam.PolicyStatement(
                    sid="ListCampaignsAndResults",
                    actions=["s3:ListBucket"],
                    resources=[results_bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": [f"{p}*" for p in prefixes]}},
                ),
                iam.PolicyStatement(
                    sid="PublishStatus",
                    actions=["ssm:PutParameter", "ssm:GetParameter"],
                    resources=[status_parameters_arn],
                ),
            ],
        )

        validations = Validations.of(self.policy)
        validations.acknowledge(
            *(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{_nag_form(stack, arn)}]",
                    reason=f"Campaign and shard names are chosen per run, so the agent needs "
                    f"every key under {prefix} of this one bucket; no other prefix, no other "
                    "bucket, and no delete.",
                )
                for prefix, arn in zip(prefixes, object_arns, strict=True)
            ),
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{_nag_form(stack, status_parameters_arn)}]",
                reason="Status parameters are named /bench/<campaign>/<shard> per run and do "
                "not exist at deploy time; the grant is put/get under /bench/ only.",
            ),
        )
        Validations.of(self.role).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM4[Policy::{_nag_form(stack, ssm_core.managed_policy_arn)}]",
                reason="AWS's own minimal policy for Session Manager and Run Command, the only "
                "way into the instances (no SSH, no inbound rule); writing it by hand would "
                "only lag behind the SSM agent's needs.",
            )
        )


def _nag_form(stack: Stack, value: str) -> str:
    """How cdk-nag spells a resource or policy in a granular finding id (`Resource::<this>`).

    cdk-nag flattens the resolved value: literal text stays, `{"Ref": X}` becomes `<X>`,
    `{"Fn::GetAtt": [X, Y]}` becomes `<X.Y>`, `Fn::Join` concatenates. Computing the id from
    the same token keeps acknowledgements right when logical ids or the partition change.
    """
    return _flatten(stack.resolve(value))


def _flatten(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            return f"<{argument}>"
        if function == "Fn::GetAtt":
            return f"<{argument[0]}.{argument[1]}>"
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(_flatten(part) for part in parts)
    raise ValueError(f"cannot spell {value!r} the way cdk-nag does")
