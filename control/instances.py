"""The project's instances, found by their tags (`bench:campaign`, `bench:shard`).

Tags are the only bookkeeping: no local state file, so any workstation (or a second terminal)
sees the same campaign, and a crashed launcher leaves nothing it cannot find again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contract.layout import TAG_CAMPAIGN, TAG_SHARD
from control.aws import AwsClients

__all__ = [
    "LISTED_STATES",
    "LIVE_STATES",
    "TAG_MAX_RUNTIME_H",
    "BenchInstance",
    "find_instances",
]

# Written by the launcher, read by `bench cleanup`: the campaign's max runtime when launched.
TAG_MAX_RUNTIME_H = "bench:max-runtime-h"
# EC2 adds this tag to every instance launched from a launch template.
_TAG_LAUNCH_TEMPLATE = "aws:ec2launchtemplate:id"

LIVE_STATES = ("pending", "running")  # working, or about to: a shard with one is launched
# What cleanup looks at: anything not already on its way out (a stopped instance still bills
# its volume; shutting-down and terminated ones end by themselves).
LISTED_STATES = ("pending", "running", "stopping", "stopped")


@dataclass(frozen=True, slots=True)
class BenchInstance:
    """One tagged instance.

    Attributes:
        instance_id: i-...
        campaign: its `bench:campaign` tag.
        shard: its `bench:shard` tag ("" if missing).
        state: pending, running, stopping, stopped, shutting-down, terminated.
        instance_type: e.g. g6.xlarge.
        market: spot or on-demand.
        availability_zone: e.g. us-east-1b.
        subnet_id: its subnet.
        launch_time: when it was launched (aware UTC).
        max_runtime_h: the campaign's max runtime when launched, if tagged.
    """

    instance_id: str
    campaign: str
    shard: str
    state: str
    instance_type: str
    market: str
    availability_zone: str
    subnet_id: str
    launch_time: datetime
    max_runtime_h: float | None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def find_instances(
    clients: AwsClients,
    *,
    campaign: str | None = None,
    states: Sequence[str] | None = LISTED_STATES,
    spot_launch_templates: Collection[str] = (),
) -> list[BenchInstance]:
    """Instances carrying the campaign tag (of `campaign`, or of any campaign).

    Args:
        clients: the AWS clients.
        campaign: only this campaign's; None for every campaign's.
        states: instance states to include; None for all (terminated ones linger ~1 h).
        spot_launch_templates: the stack's spot templates, to name the market of instances
            whose `InstanceLifecycle` is not reported.

    Returns:
        Oldest first.
    """
    filters: list[dict[str, Any]] = [
        {"Name": f"tag:{TAG_CAMPAIGN}", "Values": [campaign]}
        if campaign is not None
        else {"Name": "tag-key", "Values": [TAG_CAMPAIGN]}
    ]
    if states is not None:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    paginator = clients.client("ec2").get_paginator("describe_instances")
    found = [
        _instance(raw, spot_launch_templates)
        for page in paginator.paginate(Filters=filters)
        for reservation in page.get("Reservations", [])
        for raw in reservation.get("Instances", [])
    ]
    return sorted(found, key=lambda i: (i.launch_time, i.instance_id))


def _instance(raw: dict[str, Any], spot_launch_templates: Collection[str]) -> BenchInstance:
    tags = _tags(raw.get("Tags", []))
    spot = (
        raw.get("InstanceLifecycle") == "spot"
        or tags.get(_TAG_LAUNCH_TEMPLATE, "") in spot_launch_templates
    )
    try:
        max_runtime_h: float | None = float(tags[TAG_MAX_RUNTIME_H])
    except (KeyError, ValueError):
        max_runtime_h = None
    return BenchInstance(
        instance_id=raw["InstanceId"],
        campaign=tags.get(TAG_CAMPAIGN, ""),
        shard=tags.get(TAG_SHARD, ""),
        state=raw.get("State", {}).get("Name", "unknown"),
        instance_type=raw.get("InstanceType", ""),
        market="spot" if spot else "on-demand",
        availability_zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
        subnet_id=raw.get("SubnetId", ""),
        launch_time=raw["LaunchTime"],
        max_runtime_h=max_runtime_h,
    )


def _tags(tags: Iterable[dict[str, str]]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in tags}
