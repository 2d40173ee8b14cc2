"""`bench status`: each shard's agent status (SSM) joined with its instance's state (EC2).

A campaign's shards are the union of those its spec names (the copy in S3), those with a
status parameter and those with a tagged instance, so a shard that was never launched, one
whose instance is gone and one that never published all show up. A running instance whose
heartbeat is older than `STALE_AFTER` is marked stale; a shard whose instance ended before
its work did is marked lost (relaunch it with `bench launch`; the agent skips finished jobs).
When a shard has no status parameter (`bench cleanup` deletes them once no instance is left),
its state comes from what the agent uploaded: a finished manifest says `done` (or `failed`,
naming the failed jobs), and the jobs' `done` markers say how far it got, so a finished
campaign never shows as lost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.exceptions import ClientError

from contract.jobs import Manifest
from contract.layout import JOBS_DIR, MANIFEST_FILE, campaign_prefix, results_prefix, spec_key
from contract.results import DONE_FILE
from control.aws import AwsClients
from control.errors import ControlError
from control.instances import BenchInstance, find_instances
from control.spec import parse_spec_text
from control.stack import StackOutputs
from control.status_record import StatusReading, read_status_value

__all__ = [
    "STALE_AFTER",
    "CampaignStatus",
    "ShardRow",
    "campaign_status",
    "list_campaigns",
    "read_statuses",
]

STALE_AFTER = timedelta(minutes=5)  # the agent publishes at least once a minute


@dataclass(frozen=True, slots=True)
class ShardRow:
    """One shard: its current instance (if any) and its last status (if any).

    Attributes:
        shard: the shard's name.
        instance: the live instance if there is one, else the newest one EC2 still lists.
        status: the agent's last status parameter.
        heartbeat_age: now minus the status's heartbeat.
        stale: a live instance whose heartbeat is older than `STALE_AFTER` (or that has
            published nothing that long after launch).
        note: a short remark (not launched, lost, interrupted, status of an earlier instance).
        uploaded_phase: `done` or `failed` from the uploaded manifest, when there is no
            status parameter (deleted by `bench cleanup`) to say so.
    """

    shard: str
    instance: BenchInstance | None
    status: StatusReading | None
    heartbeat_age: timedelta | None
    stale: bool
    note: str = ""
    uploaded_phase: str | None = None

    @property
    def terminal(self) -> bool:
        return (self.status is not None and self.status.terminal) or bool(self.uploaded_phase)


@dataclass(frozen=True, slots=True)
class CampaignStatus:
    """A campaign's shards at `checked_at`.

    Attributes:
        campaign: its name.
        rows: one per shard, spec order first, then any others by name.
        spec_uri: the spec's S3 URI, if it is there.
        checked_at: when this was read.
    """

    campaign: str
    rows: tuple[ShardRow, ...]
    spec_uri: str | None
    checked_at: datetime

    @property
    def finished(self) -> bool:
        """Every shard is done, failed or interrupted: nothing changes without a relaunch."""
        return bool(self.rows) and all(row.terminal for row in self.rows)


def campaign_status(
    clients: AwsClients,
    stack: StackOutputs,
    campaign: str,
    *,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> CampaignStatus:
    """Read one campaign.

    Raises:
        ControlError: the name is not a campaign name, or nothing of it exists (no spec, no
            status parameter, no instance).
    """
    try:
        campaign_prefix(campaign)
    except ValueError as exc:
        raise ControlError(str(exc)) from exc
    spec_shards, spec_uri = _spec_shards(clients, stack.bucket, campaign)
    statuses = read_statuses(clients, stack.status_prefix, campaign)
    instances = find_instances(
        clients, campaign=campaign, states=None, spot_launch_templates=stack.spot_launch_templates
    )
    if spec_uri is None and not statuses and not instances:
        raise ControlError(
            f"campaign {campaign!r} not found: no spec at s3://{stack.bucket}/"
            f"{spec_key(campaign)}, no status parameter under {stack.status_prefix}{campaign}/, "
            "no instance tagged with it (`bench status` lists the campaigns there are)"
        )
    checked_at = now()
    names = list(spec_shards)
    names += sorted(({s.shard for s in statuses} | {i.shard for i in instances}) - set(names))
    by_shard = {s.shard: s for s in statuses}
    rows = tuple(
        _row(
            shard,
            _current_instance([i for i in instances if i.shard == shard]),
            by_shard.get(shard),
            checked_at,
            None if shard in by_shard else _uploaded(clients, stack.bucket, campaign, shard),
        )
        for shard in names
    )
    return CampaignStatus(campaign, rows, spec_uri, checked_at)


def list_campaigns(clients: AwsClients, stack: StackOutputs) -> list[str]:
    """Campaigns with a status parameter or a tagged instance EC2 still lists."""
    names = {s.campaign for s in read_statuses(clients, stack.status_prefix, None)}
    names |= {
        i.campaign
        for i in find_instances(
            clients, states=None, spot_launch_templates=stack.spot_launch_templates
        )
        if i.campaign
    }
    return sorted(names)


def read_statuses(clients: AwsClients, prefix: str, campaign: str | None) -> list[StatusReading]:
    """Every status parameter under `prefix` (`/bench/`) of a campaign (or of all), read."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    path = prefix if campaign is None else f"{prefix}{campaign}/"
    paginator = clients.client("ssm").get_paginator("get_parameters_by_path")
    found: list[StatusReading] = []
    for page in paginator.paginate(Path=path.rstrip("/") or "/", Recursive=True):
        for parameter in page.get("Parameters", []):
            parts = parameter["Name"][len(prefix) :].split("/")
            if len(parts) != 2 or (campaign is not None and parts[0] != campaign):
                continue  # not /bench/<campaign>/<shard>
            found.append(
                read_status_value(
                    parts[0],
                    parts[1],
                    parameter.get("Value", ""),
                    modified=parameter.get("LastModifiedDate"),
                )
            )
    return found


def _spec_shards(clients: AwsClients, bucket: str, campaign: str) -> tuple[list[str], str | None]:
    key = spec_key(campaign)
    try:
        data = clients.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
            return [], None
        raise
    uri = f"s3://{bucket}/{key}"
    try:
        spec = parse_spec_text(data, source=uri)
    except ValueError:
        return [], uri  # shown through its status parameters and instances instead
    return [s.name for s in spec.shards], uri


def _current_instance(instances: Iterable[BenchInstance]) -> BenchInstance | None:
    ordered = sorted(instances, key=lambda i: (i.live, i.launch_time))
    return ordered[-1] if ordered else None


def _uploaded(clients: AwsClients, bucket: str, campaign: str, shard: str) -> tuple[str, str]:
    """(phase or "", note) from the shard's uploads: its manifest, else its done markers."""
    prefix = results_prefix(campaign, shard)
    s3 = clients.client("s3")
    done = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"][len(prefix) :]
            done += key.startswith(JOBS_DIR) and key.endswith("/" + DONE_FILE)
    try:
        body = s3.get_object(Bucket=bucket, Key=prefix + MANIFEST_FILE)["Body"].read()
        manifest = Manifest.model_validate_json(body)
    except ClientError:
        manifest = None
    except ValueError as exc:
        return "", f"uploaded manifest unreadable ({type(exc).__name__}); {done} job(s) done"
    if manifest is not None and manifest.finished_unix_s is not None:
        if set(manifest.jobs) <= set(manifest.jobs_ok):
            return "done", f"every job done (from the uploaded manifest; {len(manifest.jobs)})"
        failed = ", ".join(manifest.jobs_failed) or "some"
        return "failed", f"ended; job(s) not done: {failed} (from the uploaded manifest)"
    return "", f"{done} job(s) done in S3" if done else ""


def _row(
    shard: str,
    instance: BenchInstance | None,
    status: StatusReading | None,
    now: datetime,
    uploaded: tuple[str, str] | None = None,
) -> ShardRow:
    heartbeat = status.heartbeat if status is not None else None
    age = now - heartbeat if heartbeat is not None else None
    live = instance is not None and instance.live
    terminal = status is not None and status.terminal
    stale = False
    if live and not terminal:
        assert instance is not None
        since = heartbeat or instance.launch_time
        stale = now - since > STALE_AFTER
    note = ""
    if instance is None:
        note = "not launched" if status is None else "no instance"
    elif not live and not terminal:
        note = f"lost: instance {instance.state}; relaunch with bench launch"
    if status is not None and status.phase == "interrupted":
        note = "spot interrupted; relaunch with bench launch"
    recorded = status.record.instance_id if status is not None and status.record else None
    if instance is not None and recorded and recorded != instance.instance_id:
        note = f"status is from {recorded}, an earlier instance"
    if status is not None and status.error:
        note = f"status parameter malformed: {status.error}"
    if stale and heartbeat is None:
        note = "no status published since launch"
    phase, uploaded_note = uploaded or ("", "")
    if phase and not live:
        note = uploaded_note  # finished: not lost, whatever happened to the instance since
    elif uploaded_note:
        note = f"{note}; {uploaded_note}" if note else uploaded_note
    return ShardRow(shard, instance, status, age, stale, note, phase or None)
