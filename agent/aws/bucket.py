"""The results bucket: its name (`$BENCH_BUCKET` unless given), a shard's results URI, and
the one error every S3 transfer of the agent raises when it fails for good.

Layout (contract.layout, docs/DESIGN.md "Results layout"): a shard's results live under
`results/<campaign>/<shard>/` of the results bucket: `jobs/<job>/<file>` for each job folder
(`agent.aws.uploader`), then `manifest.json` and `results.tar.gz` (`agent.aws.tarball`) at the
end. The campaign spec is `campaigns/<campaign>/spec.toml` (`agent.aws.restore`).
"""

from __future__ import annotations

import os

from contract.errors import BenchError
from contract.layout import AGENT_ENV_BUCKET, results_prefix

__all__ = ["UploadError", "bucket_name", "results_uri"]


class UploadError(BenchError, RuntimeError):
    """A results or spec transfer failed for good; the message names the object."""


def bucket_name(bucket: str | None) -> str:
    """`bucket`, else `$BENCH_BUCKET`; UploadError when neither names one."""
    name = bucket or os.environ.get(AGENT_ENV_BUCKET, "").strip()
    if not name:
        raise UploadError(f"no results bucket: ${AGENT_ENV_BUCKET} is not set")
    return name


def results_uri(campaign: str, shard: str, bucket: str | None = None) -> str:
    """`s3://<bucket>/results/<campaign>/<shard>/`: where a shard's results go."""
    return f"s3://{bucket_name(bucket)}/{results_prefix(campaign, shard)}"
