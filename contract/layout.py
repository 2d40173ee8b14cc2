"""Names the workstation, the stack and the instance agree on: S3 keys, SSM names, tags, outputs.

`infra/` declares resources and permissions with these, the launcher and `bench status|fetch`
look things up with them, and the agent on the instance writes under them. Stdlib only: the
CDK app imports this module, and so does the agent, which has no CDK.

Layout (docs/DESIGN.md, "Results layout"):

    s3://<bucket>/campaigns/<campaign>/spec.toml    campaign spec, written by the launcher
    s3://<bucket>/results/<campaign>/<shard>/...    one shard's results, written by the agent:
        jobs/<job>/...                              each finished job's folder (`done` last)
        manifest.json, results.tar.gz               at the end: manifest, and the whole folder
    SSM parameter /bench/<campaign>/<shard>         status JSON (< 4 KB), written by the agent

An instance learns its campaign and shard from its own tags (`bench:campaign`, `bench:shard`,
readable at `http://169.254.169.254/latest/meta-data/tags/instance/<key>` because the launch
templates put instance tags in the metadata), and the stack's names from the environment file
its user data writes (`AGENT_ENV_*` below).
"""

from __future__ import annotations

import re

__all__ = [
    "AGENT_ENV_BUCKET",
    "AGENT_ENV_HF_SECRET_ID",
    "AGENT_ENV_REGION",
    "CAMPAIGNS_PREFIX",
    "FAILURE_GRACE_MIN",
    "JOBS_DIR",
    "MANIFEST_FILE",
    "OUTPUT_AMI_PARAMETERS",
    "OUTPUT_BUCKET",
    "OUTPUT_HF_SECRET_ARN",
    "OUTPUT_INSTANCE_ROLE_ARN",
    "OUTPUT_MAX_HOURS",
    "OUTPUT_STATUS_PREFIX",
    "OUTPUT_SUBNETS_BY_AZ",
    "RESULTS_PREFIX",
    "SPEC_FILE",
    "STACK_NAME",
    "STATUS_PARAMETER_PREFIX",
    "TAG_CAMPAIGN",
    "TAG_SHARD",
    "TARBALL_FILE",
    "campaign_prefix",
    "job_prefix",
    "launch_template_output",
    "results_prefix",
    "spec_key",
    "status_parameter_name",
]

# --- S3 key prefixes in the results bucket (each ends with "/") ---
CAMPAIGNS_PREFIX = "campaigns/"
RESULTS_PREFIX = "results/"

# --- Names under those prefixes ---
SPEC_FILE = "spec.toml"  # campaigns/<campaign>/spec.toml
JOBS_DIR = "jobs/"  # results/<campaign>/<shard>/jobs/<job>/ (and the same in the local folder)
MANIFEST_FILE = "manifest.json"  # results/<campaign>/<shard>/manifest.json
TARBALL_FILE = "results.tar.gz"  # results/<campaign>/<shard>/results.tar.gz: the shard folder

# --- SSM Parameter Store: one status parameter per shard, under this path ---
STATUS_PARAMETER_PREFIX = "/bench/"

# --- EC2 tag keys the launcher puts on every instance (and its volumes) ---
TAG_CAMPAIGN = "bench:campaign"
TAG_SHARD = "bench:shard"

# Minutes a failed instance stays up before powering off, so someone can look in over SSM
# (the user data when bootstrap fails, the agent when its run fails).
FAILURE_GRACE_MIN = 15

# --- The CloudFormation stack and the output keys the launcher reads ---
STACK_NAME = "BenchStack"
OUTPUT_BUCKET = "ResultsBucketName"
OUTPUT_SUBNETS_BY_AZ = "SubnetIdsByAz"  # a JSON object: {"us-east-1a": "subnet-...", ...}
OUTPUT_HF_SECRET_ARN = "HfTokenSecretArn"
OUTPUT_STATUS_PREFIX = "StatusParameterPrefix"
OUTPUT_MAX_HOURS = "MaxHours"  # the instances' power-off backstop, hours after boot
OUTPUT_INSTANCE_ROLE_ARN = "InstanceRoleArn"  # what the launcher passes (iam:PassRole)
OUTPUT_AMI_PARAMETERS = "AmiParameters"  # JSON: CPU architecture -> the public SSM parameter

# --- Environment of the agent's systemd unit on an instance (written by the user data) ---
AGENT_ENV_BUCKET = "BENCH_BUCKET"
AGENT_ENV_HF_SECRET_ID = "BENCH_HF_SECRET_ID"  # the secret's ARN; never the token itself
AGENT_ENV_REGION = "AWS_DEFAULT_REGION"

# Campaign and shard names become S3 key segments and SSM path segments; SSM allows
# [a-zA-Z0-9_.-] in a path segment, S3 allows more, so the SSM rule is the one to keep.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def _check_name(kind: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{kind} {value!r} must be 1-128 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return value


def campaign_prefix(campaign: str) -> str:
    """The S3 key prefix of a campaign's spec: `campaigns/<campaign>/`.

    Raises:
        ValueError: the campaign name cannot be a key segment.
    """
    return f"{CAMPAIGNS_PREFIX}{_check_name('campaign', campaign)}/"


def spec_key(campaign: str) -> str:
    """The S3 key of a campaign's spec: `campaigns/<campaign>/spec.toml`.

    Raises:
        ValueError: the campaign name cannot be a key segment.
    """
    return f"{campaign_prefix(campaign)}{SPEC_FILE}"


def results_prefix(campaign: str, shard: str | None = None) -> str:
    """The S3 key prefix of a campaign's results (`results/<campaign>/`) or of one shard's.

    Raises:
        ValueError: the campaign or shard name cannot be a key segment.
    """
    prefix = f"{RESULTS_PREFIX}{_check_name('campaign', campaign)}/"
    return prefix if shard is None else f"{prefix}{_check_name('shard', shard)}/"


def job_prefix(campaign: str, shard: str, job: str) -> str:
    """The S3 key prefix of one job's folder: `results/<campaign>/<shard>/jobs/<job>/`.

    Raises:
        ValueError: a name cannot be a key segment.
    """
    return f"{results_prefix(campaign, shard)}{JOBS_DIR}{_check_name('job', job)}/"


def status_parameter_name(campaign: str, shard: str) -> str:
    """The SSM parameter a shard's agent publishes its status to: `/bench/<campaign>/<shard>`.

    Raises:
        ValueError: the campaign or shard name cannot be an SSM path segment.
    """
    campaign, shard = _check_name("campaign", campaign), _check_name("shard", shard)
    return f"{STATUS_PARAMETER_PREFIX}{campaign}/{shard}"


# One spot/on-demand launch template pair per CPU architecture (contract.gpus), each pair on
# that architecture's AMI: output keys are alphanumeric, so the architecture is spelled here.
_ARCH_OUTPUT_SUFFIX = {"x86_64": "X8664", "arm64": "Arm64"}


def launch_template_output(cpu_arch: str, market: str) -> str:
    """The stack output naming the launch template of an architecture and market.

    Raises:
        ValueError: an unknown architecture or market.
    """
    if cpu_arch not in _ARCH_OUTPUT_SUFFIX or market not in ("spot", "on-demand"):
        raise ValueError(f"no launch template output for {cpu_arch!r} {market!r}")
    prefix = "Spot" if market == "spot" else "OnDemand"
    return f"{prefix}LaunchTemplateId{_ARCH_OUTPUT_SUFFIX[cpu_arch]}"
