"""`bench launch`: one instance per shard; spot in every subnet first, then on-demand in each.

For each shard, in parallel:

1. Already launched? A pending or running instance tagged with the campaign and shard is
   left alone (relaunching is safe). A shard whose instance is gone gets a new one, and its
   agent skips the jobs whose results are already in S3.
2. Subnets: the stack's subnets whose zone offers the type (DescribeInstanceTypeOfferings),
   in the stack's zone order.
3. Attempts: RunInstances with the stack's spot launch template for the shard's CPU
   architecture (its GPU family's, contract.gpus) in each subnet, then with that
   architecture's on-demand template in each subnet; `SubnetId` and `InstanceType` at the top level,
   tags `bench:campaign`, `bench:shard`, `Name` (and the max runtime, for `bench cleanup`)
   on the instance and its volume; a ClientToken derived from (campaign, shard, market,
   subnet) and the shard's earlier instances still listed (`client_token`), so a retried
   call, or a second `bench launch` of the same campaign at the same time, converges on
   one instance, while a relaunch after the shard's instance ended gets a new one. Each
   failure is classified by the table in `control.errors`; each attempt is reported as
   one line (subnet, market, outcome), as the seeds' create tool printed them.

Before any instance starts, the spec is validated and uploaded to
`s3://<bucket>/campaigns/<name>/spec.toml`, every shard's architecture is checked to have
launch templates in the stack and every shard's type to be offered in some zone of the
stack; a failure there launches nothing.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from contract.gpus import gpu_family
from contract.layout import TAG_CAMPAIGN, TAG_SHARD, spec_key, status_parameter_name
from control.aws import AwsClients
from control.errors import (
    SPOT_AUTH_ERRORS,
    ControlError,
    LaunchAction,
    LaunchError,
    classify_launch_error,
)
from control.instances import LIVE_STATES, TAG_MAX_RUNTIME_H, BenchInstance, find_instances
from control.quotas import quota_group, quota_increase_command
from control.spec import CampaignSpec, ShardSpec
from control.stack import StackOutputs, check_bucket
from control.status_record import ACTIVE_PHASES, StatusReading, read_status_value

__all__ = [
    "MARKETS",
    "RETRY_LIMIT",
    "Attempt",
    "CampaignLaunch",
    "ShardLaunch",
    "ShardWait",
    "backoff_s",
    "client_token",
    "launch_campaign",
    "wait_for_agents",
]

Market = Literal["spot", "on-demand"]
MARKETS: tuple[Market, ...] = ("spot", "on-demand")
RETRY_LIMIT = 5  # tries of one subnet while throttled or faulted, then the next subnet
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 20.0
MAX_PARALLEL_SHARDS = 8
LAUNCH_TEMPLATE_VERSION = "$Latest"  # what the last `cdk deploy` wrote


@dataclass(frozen=True, slots=True)
class Attempt:
    """One RunInstances call.

    Attributes:
        shard: the shard.
        market: spot or on-demand.
        subnet_id: the subnet tried.
        availability_zone: its zone.
        instance_id: the instance, if launched.
        instance_type: the type asked for.
        error: the classified failure, if it failed.
        try_number: 1 for the first call in this subnet and market; more after a retry.
        retry_in_s: the back-off before the next try, when the action is a retry.
    """

    shard: str
    market: Market
    subnet_id: str
    availability_zone: str
    instance_type: str
    instance_id: str | None = None
    error: LaunchError | None = None
    try_number: int = 1
    retry_in_s: float | None = None

    @property
    def launched(self) -> bool:
        return self.instance_id is not None

    def line(self) -> str:
        """`<shard>: <subnet> (<zone>) <market>: <outcome>`, the seeds' one-line form."""
        where = f"{self.shard}: {self.subnet_id} ({self.availability_zone}) {self.market}"
        if self.instance_id is not None:
            return f"{where}: ✅ launched {self.instance_id} ({self.instance_type})"
        assert self.error is not None
        outcome = (
            f"{self.error.code}: {self.error.message}" if self.error.message else (self.error.code)
        )
        if self.error.action is LaunchAction.RETRY and self.retry_in_s is not None:
            then = f"retry in {self.retry_in_s:.1f} s (try {self.try_number + 1} of {RETRY_LIMIT})"
        elif self.error.action is LaunchAction.RETRY:
            then = f"next subnet (gave up after {self.try_number} tries)"
        else:
            then = self.error.action.value
        mark = "⏳" if self.error.action is LaunchAction.RETRY else "❌"
        return f"{where}: {mark} {outcome} -> {then}"


@dataclass(frozen=True, slots=True)
class ShardLaunch:
    """What happened to one shard.

    Attributes:
        shard: the shard's name.
        instance_type: its type.
        outcome: launched (now), running (already was; nothing started) or failed.
        instance_id: the shard's instance (new or existing).
        market: its market.
        availability_zone: its zone.
        attempts: every RunInstances call made for it, in order.
        error: why it failed, one line.
    """

    shard: str
    instance_type: str
    outcome: Literal["launched", "running", "failed"]
    instance_id: str | None = None
    market: str | None = None
    availability_zone: str | None = None
    attempts: tuple[Attempt, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CampaignLaunch:
    """The result of `launch_campaign`.

    Attributes:
        campaign: its name.
        spec_uri: where the spec was put.
        spec_replaced: the spec in S3 differed from this one and was replaced.
        shards: one record per shard, in spec order.
    """

    campaign: str
    spec_uri: str
    spec_replaced: bool
    shards: tuple[ShardLaunch, ...]

    @property
    def ok(self) -> bool:
        return all(s.outcome != "failed" for s in self.shards)


@dataclass(frozen=True, slots=True)
class ShardWait:
    """Where a shard stood when `wait_for_agents` returned.

    Attributes:
        shard: the shard.
        instance_id: its instance.
        phase: the agent's last published phase (None if it published none).
        outcome: ready (the agent is past booting), lost (the instance ended first) or
            timeout.
    """

    shard: str
    instance_id: str
    phase: str | None
    outcome: Literal["ready", "lost", "timeout"]


def backoff_s(try_number: int, *, jitter: Callable[[], float] = random.random) -> float:
    """Exponential back-off with jitter: about 1, 2, 4, 8 s ... capped at 20 s."""
    base = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (try_number - 1))
    return base * (0.5 + 0.5 * jitter())


def launch_campaign(
    clients: AwsClients,
    stack: StackOutputs,
    spec: CampaignSpec,
    spec_bytes: bytes,
    *,
    on_attempt: Callable[[Attempt], None] = lambda attempt: None,
    sleep: Callable[[float], None] = time.sleep,
    max_parallel: int = MAX_PARALLEL_SHARDS,
) -> CampaignLaunch:
    """Upload the spec and give every shard an instance.

    Args:
        clients: the AWS clients (RunInstances goes through `clients.launch_ec2`).
        stack: BenchStack's outputs.
        spec: the validated spec.
        spec_bytes: the spec file's exact bytes (uploaded as is).
        on_attempt: called with every attempt as it completes (from the shards' threads).
        sleep: the back-off sleep (tests pass a recorder).
        max_parallel: shards launched at once.

    Raises:
        ControlError: the bucket is gone, a type is offered in none of the stack's zones, or
            the campaign runs with a different spec. Nothing is launched then.
    """
    check_bucket(clients, stack.bucket)
    for shard in spec.shards:
        try:
            stack.launch_template(shard_architecture(shard), "spot")
        except ControlError as exc:
            raise ControlError(f"shard {shard.name} ({shard.instance_type}): {exc}") from exc
    listed = find_instances(
        clients,
        campaign=spec.name,
        states=None,
        spot_launch_templates=stack.spot_launch_templates,
    )
    live = [i for i in listed if i.state in LIVE_STATES]
    earlier: dict[str, list[str]] = {}
    for instance in listed:
        earlier.setdefault(instance.shard, []).append(instance.instance_id)
    subnets = {
        instance_type: _offering_subnets(clients, stack, instance_type)
        for instance_type in sorted({s.instance_type for s in spec.shards})
    }
    spec_replaced = _upload_spec(clients, stack.bucket, spec.name, spec_bytes, running=live)

    live_by_shard: dict[str, BenchInstance] = {}
    for instance in live:
        live_by_shard.setdefault(instance.shard, instance)

    def one(shard: ShardSpec) -> ShardLaunch:
        existing = live_by_shard.get(shard.name)
        if existing is not None:
            return ShardLaunch(
                shard=shard.name,
                instance_type=existing.instance_type,
                outcome="running",
                instance_id=existing.instance_id,
                market=existing.market,
                availability_zone=existing.availability_zone,
            )
        return _ShardLauncher(
            clients=clients,
            stack=stack,
            spec=spec,
            shard=shard,
            subnets=subnets[shard.instance_type],
            earlier_instances=tuple(earlier.get(shard.name, ())),
            on_attempt=on_attempt,
            sleep=sleep,
        ).run()

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(spec.shards)))) as pool:
        results = tuple(pool.map(one, spec.shards))
    return CampaignLaunch(
        campaign=spec.name,
        spec_uri=f"s3://{stack.bucket}/{spec_key(spec.name)}",
        spec_replaced=spec_replaced,
        shards=results,
    )


def shard_architecture(shard: ShardSpec) -> str:
    """The CPU architecture of the shard's instance type (its GPU family's).

    Raises:
        ControlError: the type is not a known GPU family.
    """
    family = gpu_family(shard.instance_type)
    if family is None:
        raise ControlError(
            f"shard {shard.name}: {shard.instance_type} is not a known GPU instance family"
        )
    return family.cpu_arch


def _offering_subnets(
    clients: AwsClients, stack: StackOutputs, instance_type: str
) -> list[tuple[str, str]]:
    """(zone, subnet) of the stack's subnets whose zone offers the type, in the stack's order."""
    paginator = clients.client("ec2").get_paginator("describe_instance_type_offerings")
    offered = {
        offering["Location"]
        for page in paginator.paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        for offering in page.get("InstanceTypeOfferings", [])
    }
    subnets = [(az, subnet) for az, subnet in stack.subnets_by_az.items() if az in offered]
    if not subnets:
        zones = ", ".join(stack.subnets_by_az)
        where = f"elsewhere: {', '.join(sorted(offered))}" if offered else "in no zone at all"
        raise ControlError(
            f"instance type {instance_type} is offered in none of the stack's zones ({zones}); "
            f"it is offered {where} of {clients.region}"
        )
    return subnets


def _upload_spec(
    clients: AwsClients, bucket: str, campaign: str, data: bytes, *, running: Sequence[object]
) -> bool:
    """Put the spec in S3; True if a different one was there. Refuse to swap it under a
    running campaign (its agents read it)."""
    s3 = clients.client("s3")
    key = spec_key(campaign)
    try:
        current: bytes | None = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in {"NoSuchKey", "404"}:
            raise
        current = None
    if current == data:
        return False
    if current is not None and running:
        raise ControlError(
            f"campaign {campaign} is running with a different spec (s3://{bucket}/{key}); "
            "give the new spec another name, or wait for the campaign (bench status) or end "
            "it (bench cleanup) first"
        )
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/toml")
    return current is not None


@dataclass
class _ShardLauncher:
    """The attempt loop of one shard (one thread)."""

    clients: AwsClients
    stack: StackOutputs
    spec: CampaignSpec
    shard: ShardSpec
    subnets: list[tuple[str, str]]
    earlier_instances: tuple[str, ...]
    on_attempt: Callable[[Attempt], None]
    sleep: Callable[[float], None]
    attempts: list[Attempt] = field(default_factory=list)

    def run(self) -> ShardLaunch:
        for market in MARKETS:
            for az, subnet in self.subnets:
                outcome = self._try_subnet(market, az, subnet)
                if isinstance(outcome, ShardLaunch):
                    return outcome
                if outcome is LaunchAction.SWITCH_MARKET:
                    break
        return self._failed(
            f"no {self.shard.instance_type} capacity in any subnet "
            f"({', '.join(az for az, _ in self.subnets)}), spot or on-demand; "
            "run `bench launch` again later (launched shards are kept) or use another type"
        )

    def _try_subnet(self, market: Market, az: str, subnet: str) -> ShardLaunch | LaunchAction:
        request = self._request(market, subnet)
        for try_number in range(1, RETRY_LIMIT + 1):
            try:
                response = self.clients.launch_ec2.run_instances(**request)
            except (ClientError, BotoCoreError) as exc:
                error = classify_launch_error(exc)
                if market == "spot" and error.code in SPOT_AUTH_ERRORS:
                    error = replace(error, action=LaunchAction.SWITCH_MARKET)
            else:
                instance = response["Instances"][0]
                self._record(
                    Attempt(
                        self.shard.name,
                        market,
                        subnet,
                        az,
                        self.shard.instance_type,
                        instance_id=instance["InstanceId"],
                        try_number=try_number,
                    )
                )
                return ShardLaunch(
                    shard=self.shard.name,
                    instance_type=self.shard.instance_type,
                    outcome="launched",
                    instance_id=instance["InstanceId"],
                    market=market,
                    availability_zone=instance.get("Placement", {}).get("AvailabilityZone", az),
                    attempts=tuple(self.attempts),
                )
            retry_in = backoff_s(try_number) if try_number < RETRY_LIMIT else None
            attempt = Attempt(
                self.shard.name,
                market,
                subnet,
                az,
                self.shard.instance_type,
                error=error,
                try_number=try_number,
                retry_in_s=retry_in if error.action is LaunchAction.RETRY else None,
            )
            self._record(attempt)
            match error.action:
                case LaunchAction.RETRY if retry_in is not None:
                    self.sleep(retry_in)
                case LaunchAction.RETRY | LaunchAction.NEXT_SUBNET:
                    return LaunchAction.NEXT_SUBNET
                case LaunchAction.SWITCH_MARKET:
                    return LaunchAction.SWITCH_MARKET
                case LaunchAction.STOP_QUOTA:
                    return self._failed(self._quota_message(error))
                case _:
                    return self._failed(f"{error.code}: {error.message}")
        return LaunchAction.NEXT_SUBNET

    def _request(self, market: Market, subnet: str) -> dict[str, Any]:
        template = self.stack.launch_template(shard_architecture(self.shard), market)
        tags = [
            {"Key": TAG_CAMPAIGN, "Value": self.spec.name},
            {"Key": TAG_SHARD, "Value": self.shard.name},
            {"Key": "Name", "Value": f"bench-{self.spec.name}-{self.shard.name}"},
            {"Key": TAG_MAX_RUNTIME_H, "Value": f"{self.spec.max_runtime_h:g}"},
        ]
        token = client_token(
            self.spec.name, self.shard.name, market, subnet, self.earlier_instances
        )
        return {
            "LaunchTemplate": {"LaunchTemplateId": template, "Version": LAUNCH_TEMPLATE_VERSION},
            "InstanceType": self.shard.instance_type,
            "SubnetId": subnet,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
        }

    def _quota_message(self, error: LaunchError) -> str:
        group = quota_group(self.shard.instance_type)
        if group is None:
            return f"{error.code}: {error.message}; raise the on-demand vCPU quota of its family"
        return (
            f"{error.code}: on-demand {group.name} vCPU quota ({group.on_demand}) reached; "
            f"ask for more: {quota_increase_command(group.on_demand, '<vCPUs>')}"
        )

    def _record(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)
        self.on_attempt(attempt)

    def _failed(self, error: str) -> ShardLaunch:
        return ShardLaunch(
            shard=self.shard.name,
            instance_type=self.shard.instance_type,
            outcome="failed",
            attempts=tuple(self.attempts),
            error=error,
        )


def wait_for_agents(
    clients: AwsClients,
    campaign: str,
    instances: Mapping[str, str],
    *,
    timeout_s: float,
    poll_s: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_change: Callable[[str, str | None], None] = lambda shard, phase: None,
) -> list[ShardWait]:
    """Wait until every shard's agent is past `booting` (installing or later).

    Args:
        clients: the AWS clients.
        campaign: the campaign.
        instances: shard -> its instance id.
        timeout_s: give up after this long (the result says `timeout` for those not ready).
        poll_s: seconds between polls.
        sleep: the sleep between polls.
        clock: a monotonic clock.
        on_change: called with (shard, phase) whenever a shard's phase changes.
    """
    ssm = clients.client("ssm")
    ec2 = clients.client("ec2")
    names = {status_parameter_name(campaign, shard): shard for shard in instances}
    pending = dict(instances)
    done: dict[str, ShardWait] = {}
    phases: dict[str, str | None] = dict.fromkeys(instances)
    deadline = clock() + timeout_s
    while True:
        statuses = _read_statuses(ssm, campaign, names, pending)
        states = _instance_states(ec2, list(pending.values()))
        for shard, instance_id in list(pending.items()):
            reading = statuses.get(shard)
            record = reading.record if reading is not None else None
            # A record from an earlier instance of the shard does not count.
            fresh = record is not None and record.instance_id in (None, instance_id)
            phase = record.phase if (record is not None and fresh) else None
            if phase != phases[shard]:
                phases[shard] = phase
                on_change(shard, phase)
            if phase in ACTIVE_PHASES:
                done[shard] = ShardWait(shard, instance_id, phase, "ready")
            elif states.get(instance_id, "terminated") not in LIVE_STATES:
                done[shard] = ShardWait(shard, instance_id, phase, "lost")
            else:
                continue
            del pending[shard]
        if not pending or clock() >= deadline:
            break
        sleep(min(poll_s, max(0.0, deadline - clock())))
    for shard, instance_id in pending.items():
        done[shard] = ShardWait(shard, instance_id, phases[shard], "timeout")
    return [done[shard] for shard in instances]


def _read_statuses(
    ssm: Any, campaign: str, names: Mapping[str, str], pending: Mapping[str, str]
) -> dict[str, StatusReading]:
    wanted = [name for name, shard in names.items() if shard in pending]
    found: dict[str, StatusReading] = {}
    for start in range(0, len(wanted), 10):  # GetParameters takes at most 10 names
        response = ssm.get_parameters(Names=wanted[start : start + 10])
        for parameter in response.get("Parameters", []):
            shard = names[parameter["Name"]]
            found[shard] = read_status_value(
                campaign, shard, parameter["Value"], modified=parameter.get("LastModifiedDate")
            )
    return found


def _instance_states(ec2: Any, instance_ids: list[str]) -> dict[str, str]:
    if not instance_ids:
        return {}
    states: dict[str, str] = {}
    paginator = ec2.get_paginator("describe_instances")
    for page in paginator.paginate(InstanceIds=instance_ids):
        for reservation in page.get("Reservations", []):
            for raw in reservation.get("Instances", []):
                states[raw["InstanceId"]] = raw.get("State", {}).get("Name", "unknown")
    return states


def client_token(
    campaign: str, shard: str, market: str, subnet: str, earlier_instances: Sequence[str]
) -> str:
    """RunInstances' ClientToken for one attempt (at most 64 ASCII characters).

    Two launches of one campaign at the same time see the same instances and derive the same
    token, so EC2 starts one instance and returns it to both. The shard's earlier instances
    (any state; terminated ones stay listed for about an hour) are part of it: after the
    shard's instance ended, a relaunch derives a new token instead of being handed the ended
    instance again.
    """
    generation = ",".join(sorted(earlier_instances))
    text = f"{campaign}/{shard}/{market}/{subnet}/{generation}"
    return hashlib.sha256(text.encode()).hexdigest()[:64]
