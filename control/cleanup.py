"""`bench cleanup`: find every instance this project tagged, end those that should have ended.

An instance is terminated when its shard's status says done or failed, when its whole
campaign is finished, or when it has run longer than the max runtime it was launched with
(the `bench:max-runtime-h` tag). Everything else is listed and kept. A campaign's status
parameters are deleted once none of its instances is left (after this cleanup's
terminations). `plan_cleanup` only reads; `apply_cleanup` acts on a plan the user saw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from contract.layout import STATUS_PARAMETER_PREFIX, status_parameter_name
from control.aws import AwsClients
from control.instances import LISTED_STATES, LIVE_STATES, BenchInstance, find_instances
from control.stack import StackOutputs
from control.status import read_statuses
from control.status_record import StatusReading

__all__ = ["CleanupItem", "CleanupPlan", "CleanupResult", "apply_cleanup", "plan_cleanup"]


@dataclass(frozen=True, slots=True)
class CleanupItem:
    """One tagged instance and the decision about it.

    Attributes:
        instance: the instance.
        age: now minus its launch time.
        phase: its shard's last published phase.
        terminate: why it is to be terminated; None if it is kept.
        keep: why it is kept.
    """

    instance: BenchInstance
    age: timedelta
    phase: str | None
    terminate: str | None
    keep: str = ""


@dataclass(frozen=True, slots=True)
class CleanupPlan:
    """What `apply_cleanup` would do.

    Attributes:
        items: every tagged instance not already on its way out, oldest first.
        parameters: status parameters to delete (campaigns with no instance left).
    """

    items: tuple[CleanupItem, ...]
    parameters: tuple[str, ...]

    @property
    def to_terminate(self) -> tuple[CleanupItem, ...]:
        return tuple(item for item in self.items if item.terminate is not None)

    @property
    def empty(self) -> bool:
        return not self.to_terminate and not self.parameters


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """What `apply_cleanup` did.

    Attributes:
        terminated: instance ids whose termination was requested.
        deleted: status parameters deleted.
    """

    terminated: tuple[str, ...]
    deleted: tuple[str, ...]


def plan_cleanup(
    clients: AwsClients,
    stack: StackOutputs | None,
    *,
    campaign: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> CleanupPlan:
    """Decide, reading only.

    Args:
        clients: the AWS clients.
        stack: BenchStack's outputs; None when the stack is gone (strays are still found by
            tag, status parameters under the default prefix).
        campaign: only this campaign.
        now: the clock.
    """
    instances = find_instances(
        clients,
        campaign=campaign,
        states=LISTED_STATES,
        spot_launch_templates=stack.spot_launch_templates if stack else (),
    )
    prefix = stack.status_prefix if stack is not None else STATUS_PARAMETER_PREFIX
    statuses = read_statuses(clients, prefix, campaign)
    # A relaunched shard's status record stays the old instance's (terminal) until the new
    # agent publishes `booting`, minutes later: such a record says nothing about the live
    # instance, so it neither ends that instance nor makes its campaign look finished.
    live_ids = {
        (i.campaign, i.shard): i.instance_id for i in instances if i.state in LIVE_STATES
    }
    current = [s for s in statuses if not _from_another_instance(s, live_ids)]
    by_shard = {(s.campaign, s.shard): s for s in current}
    finished = _finished_campaigns(statuses) - {
        s.campaign for s in statuses if _from_another_instance(s, live_ids)
    }
    checked_at = now()
    items = tuple(
        _decide(instance, by_shard.get((instance.campaign, instance.shard)), finished, checked_at)
        for instance in instances
    )
    remaining = {item.instance.campaign for item in items if item.terminate is None}
    parameters = tuple(
        sorted(
            status_parameter_name(s.campaign, s.shard)
            for s in statuses
            if s.campaign not in remaining
        )
    )
    return CleanupPlan(items, parameters)


def apply_cleanup(clients: AwsClients, plan: CleanupPlan) -> CleanupResult:
    """Terminate the plan's instances and delete its parameters."""
    ids = [item.instance.instance_id for item in plan.to_terminate]
    terminated: list[str] = []
    ec2 = clients.client("ec2")
    for start in range(0, len(ids), 500):
        response = ec2.terminate_instances(InstanceIds=ids[start : start + 500])
        terminated += [i["InstanceId"] for i in response.get("TerminatingInstances", [])]
    deleted: list[str] = []
    ssm = clients.client("ssm")
    names = list(plan.parameters)
    for start in range(0, len(names), 10):  # DeleteParameters takes at most 10 names
        response = ssm.delete_parameters(Names=names[start : start + 10])
        deleted += response.get("DeletedParameters", [])
    return CleanupResult(tuple(terminated), tuple(deleted))


def _from_another_instance(status: StatusReading, live_ids: dict[tuple[str, str], str]) -> bool:
    """The record names an instance other than the shard's live one."""
    live = live_ids.get((status.campaign, status.shard))
    recorded = status.record.instance_id if status.record is not None else None
    return live is not None and recorded is not None and recorded != live


def _finished_campaigns(statuses: list[StatusReading]) -> set[str]:
    campaigns: dict[str, list[StatusReading]] = {}
    for status in statuses:
        campaigns.setdefault(status.campaign, []).append(status)
    return {name for name, shards in campaigns.items() if all(s.terminal for s in shards)}


def _decide(
    instance: BenchInstance, status: StatusReading | None, finished: set[str], now: datetime
) -> CleanupItem:
    age = now - instance.launch_time
    phase = status.phase if status is not None else None
    if status is not None and status.terminal:
        reason: str | None = f"shard {phase}"
    elif instance.campaign in finished:
        reason = "campaign finished"
    elif instance.max_runtime_h is not None and age > timedelta(hours=instance.max_runtime_h):
        reason = f"past max runtime ({_hours(age)} > {instance.max_runtime_h:g} h)"
    else:
        reason = None
    keep = ""
    if reason is None:
        limit = f"{instance.max_runtime_h:g} h" if instance.max_runtime_h is not None else "none"
        keep = f"{phase or 'no status'}, within max runtime ({limit})"
    return CleanupItem(instance, age, phase, reason, keep)


def _hours(age: timedelta) -> str:
    return f"{age.total_seconds() / 3600:.1f} h"
