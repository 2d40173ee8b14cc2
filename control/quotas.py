"""Optional pre-check of the EC2 vCPU quotas a campaign needs (Service Quotas API).

GPU quotas are counted in vCPUs per instance-family group and market, and new accounts often
start at 0 (seed 002: 16 vCPUs of G and VT, on-demand and spot, "two rigs in parallel, and
no more"). The check adds up the vCPUs of the campaign's shards per group and compares them
with the applied quota (AWS's default when none was applied). It cannot see what else is
already running in the account; the launch's own `VcpuLimitExceeded` and
`MaxSpotInstanceCountExceeded` handling covers that.

Quota codes (Service Quotas, service `ec2`): Running On-Demand G and VT instances
`L-DB2E81BA`, All G and VT Spot Instance Requests `L-3819A6DF`, Running On-Demand P instances
`L-417A185B`, All P Spot Instance Requests `L-7212CCBC`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from control.aws import AwsClients
from control.errors import ControlError
from control.spec import CampaignSpec

__all__ = [
    "QUOTAS",
    "QuotaCheck",
    "QuotaGroup",
    "check_quotas",
    "quota_checks",
    "quota_group",
    "quota_increase_command",
    "quota_problem",
]


@dataclass(frozen=True, slots=True)
class QuotaGroup:
    """The quotas of one family group.

    Attributes:
        name: e.g. "G and VT".
        on_demand: quota code for running on-demand vCPUs.
        spot: quota code for spot vCPUs.
    """

    name: str
    on_demand: str
    spot: str


G_AND_VT = QuotaGroup("G and VT", on_demand="L-DB2E81BA", spot="L-3819A6DF")
P = QuotaGroup("P", on_demand="L-417A185B", spot="L-7212CCBC")
# Family-name prefix -> group (G and VT: g4dn, g5, g5g, g6, g6e, gr6, g7, vt1; P: p4d ... p6).
QUOTAS: Mapping[str, QuotaGroup] = {"g": G_AND_VT, "vt": G_AND_VT, "p": P}


@dataclass(frozen=True, slots=True)
class QuotaCheck:
    """One quota compared with what the campaign needs.

    Attributes:
        group: the family group.
        market: spot or on-demand.
        quota_code: the Service Quotas code.
        needed_vcpus: the campaign's vCPUs in this group (all shards at once).
        quota_vcpus: the quota; None if it could not be read.
        note: why it could not be read.
    """

    group: QuotaGroup
    market: str
    quota_code: str
    needed_vcpus: int
    quota_vcpus: float | None
    note: str = ""

    @property
    def ok(self) -> bool | None:
        return None if self.quota_vcpus is None else self.quota_vcpus >= self.needed_vcpus


def quota_group(instance_type: str) -> QuotaGroup | None:
    """The quota group of an instance type (None for families this check does not know)."""
    family = instance_type.split(".", 1)[0]
    letters = family.rstrip("0123456789").split("-")[0]
    prefix = "vt" if letters.startswith("vt") else letters[:1]
    return QUOTAS.get(prefix)


def quota_increase_command(quota_code: str, vcpus: int | str) -> str:
    """The AWS CLI command that asks for a quota of `vcpus`."""
    return (
        "aws service-quotas request-service-quota-increase --service-code ec2 "
        f"--quota-code {quota_code} --desired-value {vcpus}"
    )


def quota_checks(clients: AwsClients, spec: CampaignSpec) -> list[QuotaCheck]:
    """The spec's vCPUs per group (every shard at once) against the spot and on-demand
    quotas, both markets of a group side by side; nothing raised for a quota too low."""
    vcpus = _vcpus(clients, sorted({s.instance_type for s in spec.shards}))
    needed: dict[QuotaGroup, int] = {}
    for shard in spec.shards:
        group = quota_group(shard.instance_type)
        if group is not None:
            needed[group] = needed.get(group, 0) + vcpus[shard.instance_type]
    checks: list[QuotaCheck] = []
    for group, count in needed.items():
        for market, code in (("spot", group.spot), ("on-demand", group.on_demand)):
            value, note = _quota(clients, code)
            checks.append(QuotaCheck(group, market, code, count, value, note))
    return checks


def quota_problem(spot: QuotaCheck, on_demand: QuotaCheck) -> str | None:
    """The one line for a group whose quota covers the campaign in neither market."""
    if spot.ok is not False or on_demand.ok is not False:
        return None
    return (
        f"quota: the campaign needs {on_demand.needed_vcpus} {on_demand.group.name} vCPUs at "
        f"once but the spot quota ({spot.quota_code}) is {spot.quota_vcpus:g} and the "
        f"on-demand quota ({on_demand.quota_code}) is {on_demand.quota_vcpus:g}; ask for "
        f"more: {quota_increase_command(on_demand.quota_code, on_demand.needed_vcpus)}"
    )


def check_quotas(clients: AwsClients, spec: CampaignSpec) -> list[QuotaCheck]:
    """`quota_checks`, raising for a group neither market's quota covers.

    Raises:
        ControlError: for some group neither market's quota covers the campaign (the message
            names the quota and the command that asks for more).
    """
    checks = quota_checks(clients, spec)
    for spot, on_demand in zip(checks[::2], checks[1::2], strict=True):
        problem = quota_problem(spot, on_demand)
        if problem is not None:
            raise ControlError(problem)
    return checks


def _vcpus(clients: AwsClients, instance_types: list[str]) -> dict[str, int]:
    ec2 = clients.client("ec2")
    try:
        found = ec2.describe_instance_types(InstanceTypes=instance_types)["InstanceTypes"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "InvalidInstanceType":
            message = exc.response["Error"].get("Message", "")
            raise ControlError(f"instance type not known in {clients.region}: {message}") from exc
        raise
    return {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in found}


def _quota(clients: AwsClients, code: str) -> tuple[float | None, str]:
    """The applied quota, else AWS's default; (None, why) if neither can be read."""
    sq = clients.client("service-quotas")
    try:
        return float(sq.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"]), ""
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            return None, _one_line(exc)
    except BotoCoreError as exc:
        return None, _one_line(exc)
    try:
        quota = sq.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        return float(quota["Value"]), "AWS default (none applied)"
    except (ClientError, BotoCoreError) as exc:
        return None, _one_line(exc)


def _one_line(exc: Exception, limit: int = 120) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        message = " ".join(str(error.get("Message", "")).split())
        if message.startswith("<"):  # an HTML error page, not an AWS error
            message = ""
        text = f"{error.get('Code', 'Error')}: {message}" if message else str(error.get("Code"))
    else:
        text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
