"""Results: the S3 bucket that holds campaign specs and results, private, encrypted, TLS only.

Keys follow `contract.layout` (`campaigns/<campaign>/...`, `results/<campaign>/<shard>/...`).
By default the bucket and its objects go with `cdk destroy` (trials leave nothing behind);
`keep_results=True` keeps them.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Duration, RemovalPolicy, Validations
from aws_cdk import aws_s3 as s3
from constructs import Construct

__all__ = ["ResultsBucket"]

# A multipart upload that dies with its instance (spot interruption, max runtime) leaves parts
# that are billed but invisible in listings; this rule cleans them up.
ABORT_INCOMPLETE_UPLOADS_AFTER = Duration.days(1)


class ResultsBucket(Construct):
    """The results bucket.

    Attributes:
        bucket: the bucket (generated name; read it from the stack's outputs).
    """

    def __init__(self, scope: Construct, id_: str, *, keep_on_destroy: bool) -> None:
        """Declare the bucket.

        Args:
            scope: parent construct.
            id_: construct id.
            keep_on_destroy: True: retain the bucket and its objects when the stack is
                deleted. False: empty it (a CDK custom resource) and delete it with the stack.
        """
        super().__init__(scope, id_)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="abort-incomplete-multipart-uploads",
                    abort_incomplete_multipart_upload_after=ABORT_INCOMPLETE_UPLOADS_AFTER,
                )
            ],
            removal_policy=RemovalPolicy.RETAIN if keep_on_destroy else RemovalPolicy.DESTROY,
            auto_delete_objects=not keep_on_destroy,
        )
        Validations.of(self.bucket).acknowledge(
            Acknowledgment(
                id="AwsSolutions-S1",
                reason="The bucket holds benchmark specs and results (no personal or secret "
                "data), is private, TLS-only and written only by the bench instance role. "
                "Server access logs would need a second bucket kept beyond this stack; use "
                "CloudTrail S3 data events account-wide if an audit trail is required.",
            )
        )
