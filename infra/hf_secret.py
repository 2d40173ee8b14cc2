"""The Hugging Face token: a Secrets Manager secret that the stack creates empty.

The token never passes through the template, the CDK CLI's arguments, user data or tags: the
user stores it once with `aws secretsmanager put-secret-value` (README), and the agent reads it
at run time with `secretsmanager:GetSecretValue` on this one secret. Until then the secret has
no value at all, and GetSecretValue fails with ResourceNotFoundException, which the agent can
report as "HF token not set" instead of trying a placeholder against Hugging Face.
"""

from __future__ import annotations

from typing import cast

from aws_cdk import Acknowledgment, Validations
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

__all__ = ["HfTokenSecret"]


class HfTokenSecret(Construct):
    """The secret that will hold the Hugging Face token.

    Attributes:
        secret: the secret (generated name; its ARN is a stack output).
    """

    def __init__(self, scope: Construct, id_: str) -> None:
        """Declare the secret, with no value.

        Args:
            scope: parent construct.
            id_: construct id.
        """
        super().__init__(scope, id_)
        self.secret = secretsmanager.Secret(
            self,
            "Secret",
            description="Hugging Face access token for bench instances (set it after deploy)",
        )
        # The L2 construct always asks CloudFormation to generate a random value; with neither
        # GenerateSecretString nor SecretString, CloudFormation creates an empty secret.
        cfn_secret = cast(secretsmanager.CfnSecret, self.secret.node.default_child)
        cfn_secret.add_property_deletion_override("GenerateSecretString")
        Validations.of(self.secret).acknowledge(
            Acknowledgment(
                id="AwsSolutions-SMG4",
                reason="The value is a Hugging Face access token issued by huggingface.co; "
                "Secrets Manager cannot rotate it (no rotation Lambda can mint HF tokens). The "
                "user replaces it with put-secret-value; only the bench instance role reads it.",
            )
        )
