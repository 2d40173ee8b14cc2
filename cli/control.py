"""`bench launch|status|fetch|cleanup|iam-policy`: campaigns on AWS, from the workstation.

Parses nothing (cli/parser.py does), decides nothing (control does): it calls the verbs,
prints each launch attempt as one line while it happens, and renders the records as tables.
A problem the user can fix (no stack, no credentials, a bad spec, an unknown campaign, a
bucket that is not the stack's) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console, Group
from rich.table import Table

from contract.errors import BenchError
from control.aws import AwsClients
from control.cleanup import CleanupPlan, apply_cleanup, plan_cleanup
from control.errors import ControlError
from control.fetch import FetchReport, fetch_campaign
from control.launch import (
    Attempt,
    CampaignLaunch,
    ShardWait,
    launch_campaign,
    wait_for_agents,
)
from control.preflight import preflight
from control.spec import CampaignSpec, load_spec_file
from control.stack import find_stack, results_bucket
from control.status import CampaignStatus, campaign_status, list_campaigns

__all__ = ["run_control"]


def run_control(args: argparse.Namespace) -> int:
    """Run `bench launch|status|fetch|cleanup`; user errors: one line on stderr, status 2."""
    console = Console(highlight=False)
    # botocore logs whole request and response bodies at DEBUG; `-v` is for our own lines.
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        clients = AwsClients.from_environment()
        handler: Callable[[argparse.Namespace, AwsClients, Console], int] = {
            "launch": _launch,
            "status": _status,
            "fetch": _fetch,
            "cleanup": _cleanup,
            "iam-policy": _iam_policy,
        }[args.command]
        return handler(args, clients, console)
    except BenchError as exc:  # ControlError, SpecError, ...: anything else is a bug
        return _fail(args.command, str(exc))
    except ClientError as exc:
        error = exc.response.get("Error", {})
        return _fail(
            args.command,
            f"AWS {exc.operation_name}: {error.get('Code', 'Error')}: {error.get('Message', '')}",
        )
    except BotoCoreError as exc:
        return _fail(args.command, f"AWS: {exc}")


def _fail(command: str, message: str) -> int:
    print(f"bench {command}: {' '.join(message.split())}", file=sys.stderr)
    return 2


# --- launch ---


def _launch(args: argparse.Namespace, clients: AwsClients, console: Console) -> int:
    from engines.campaign import check_campaign  # the agent's own recipe check

    spec, data = load_spec_file(args.spec, check=check_campaign)
    stack = find_stack(clients, args.stack, bucket=args.bucket)
    checks = preflight(
        clients, args.stack, spec, public_sources=args.public_sources, stack=stack
    )
    if args.verbose:
        for note in checks.notes:
            console.print(f"check: {note}", soft_wrap=True, markup=False)
    if args.pin_check:
        checks.problems.extend(_pin_problems(spec, checks.warnings))
    for warning in checks.warnings:
        console.print(f"WARNING: {warning}", soft_wrap=True, markup=False)
    if checks.problems:
        for problem in checks.problems:
            print(f"bench launch: {' '.join(problem.split())}", file=sys.stderr)
        print(
            f"bench launch: {len(checks.problems)} problem(s) found before launching; "
            "nothing launched (bench plan SPEC shows them with the plan)",
            file=sys.stderr,
        )
        return 2
    lock = threading.Lock()

    def show(attempt: Attempt) -> None:
        with lock:
            console.print(attempt.line(), soft_wrap=True)

    result = launch_campaign(clients, stack, spec, data, on_attempt=show)
    console.print(_launch_table(result))
    state = "replaced" if result.spec_replaced else "in place"
    console.print(f"spec: {result.spec_uri} ({state})", soft_wrap=True)
    ok = result.ok
    if args.wait:
        instances = {s.shard: s.instance_id for s in result.shards if s.instance_id}
        waits = wait_for_agents(
            clients,
            result.campaign,
            instances,
            timeout_s=args.wait_timeout_min * 60,
            on_change=lambda shard, phase: console.print(f"{shard}: {phase or 'no status yet'}"),
        )
        console.print(_wait_table(waits))
        ok = ok and all(w.outcome == "ready" for w in waits)
    console.print(
        f"Instances terminate themselves when their shard ends and after "
        f"{spec.max_runtime_h:g} h at most. Watch: bench status {result.campaign}; "
        f"results: bench fetch {result.campaign}; strays: bench cleanup",
        soft_wrap=True,
    )
    return 0 if ok else 1


def _pin_problems(spec: CampaignSpec, warnings: list[str]) -> list[str]:
    """Engine pins that do not resolve on their index (engines.pins)."""
    from engines.pins import check_pins

    try:
        found = check_pins([spec])
    except OSError as exc:
        warnings.append(f"engine pins not checked: {exc}")
        return []
    return [f"pin {check.line()}" for check in found if not check.ok]


def _launch_table(result: CampaignLaunch) -> Table:
    table = Table(title=f"Campaign {result.campaign}")
    for column in ("shard", "type", "outcome", "instance", "market", "zone", "attempts", "error"):
        table.add_column(column, overflow="fold")
    for shard in result.shards:
        table.add_row(
            shard.shard,
            shard.instance_type,
            {"launched": "launched", "running": "already running", "failed": "FAILED"}[
                shard.outcome
            ],
            shard.instance_id or "-",
            shard.market or "-",
            shard.availability_zone or "-",
            str(len(shard.attempts)),
            shard.error or "",
        )
    return table


def _wait_table(waits: Sequence[ShardWait]) -> Table:
    table = Table(title="Agents")
    for column in ("shard", "instance", "phase", "outcome"):
        table.add_column(column)
    for wait in waits:
        table.add_row(wait.shard, wait.instance_id, wait.phase or "-", wait.outcome)
    return table


# --- status ---


def _status(args: argparse.Namespace, clients: AwsClients, console: Console) -> int:
    stack = find_stack(clients, args.stack)
    if args.campaign is None:
        names = list_campaigns(clients, stack)
        if not names:
            console.print(
                f"no campaigns: no status parameters under {stack.status_prefix} and no "
                "tagged instances"
            )
            return 0
    else:
        names = [args.campaign]

    def read() -> list[CampaignStatus]:
        return [campaign_status(clients, stack, name) for name in names]

    statuses = read()
    if not args.watch:
        for status in statuses:
            console.print(_status_table(status))
        return 0
    from rich.live import Live

    deadline = time.monotonic() + args.watch_max_min * 60
    try:
        with Live(_status_group(statuses), console=console, auto_refresh=False) as live:
            while not all(s.finished for s in statuses) and time.monotonic() < deadline:
                time.sleep(max(0.1, args.interval))
                statuses = read()
                live.update(_status_group(statuses), refresh=True)
    except KeyboardInterrupt:
        return 0
    return 0


def _status_group(statuses: Sequence[CampaignStatus]) -> Group:
    return Group(*(_status_table(s) for s in statuses))


def _status_table(status: CampaignStatus) -> Table:
    when = status.checked_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    finished = "; finished" if status.finished else ""
    table = Table(title=f"Campaign {status.campaign} at {when}{finished}")
    columns = (
        "shard",
        "instance",
        "state",
        "market",
        "zone",
        "phase",
        "job",
        "current job",
        "heartbeat",
        "ETA",
        "last error / note",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in status.rows:
        instance = row.instance
        record = row.status.record if row.status is not None else None
        phase = (row.status.phase if row.status else None) or row.uploaded_phase or "-"
        if row.stale:
            phase = f"{phase} (STALE)"
        job = "-"
        if record is not None and record.job_index:
            total = record.jobs_total if record.jobs_total is not None else "?"
            job = f"{record.job_index}/{total}"
        heartbeat = "-"
        if row.heartbeat_age is not None:
            heartbeat = f"{_duration(row.heartbeat_age)} ago"
        eta = "-"
        if record is not None and record.eta is not None and not row.terminal:
            left = record.eta - status.checked_at
            eta = f"in {_duration(left)}" if left.total_seconds() >= 0 else "overdue"
        notes = [record.last_error if record else None, row.note]
        if record is not None and record.uploads_pending:
            notes.append(f"{record.uploads_pending} job(s) not uploaded: {record.upload_error}")
        instance_id = instance.instance_id if instance else (record.instance_id if record else None)
        market = instance.market if instance else (record.market if record else None)
        table.add_row(
            row.shard,
            instance_id or "-",
            instance.state if instance else "-",
            market or "-",
            instance.availability_zone if instance else "-",
            phase,
            job,
            (record.current_job if record else None) or "-",
            heartbeat,
            eta,
            "; ".join(n for n in notes if n),
        )
    return table


def _duration(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


# --- fetch ---


def _fetch(args: argparse.Namespace, clients: AwsClients, console: Console) -> int:
    bucket = results_bucket(clients, args.stack, bucket=args.bucket)
    dest = args.dir if args.dir is not None else Path("results") / args.campaign
    report = fetch_campaign(clients, bucket, args.campaign, dest)
    for outcome in report.files:
        if outcome.outcome == "failed":
            console.print(f"{outcome.rel}: FAILED: {outcome.error}", soft_wrap=True)
    if not report.files:
        console.print(f"campaign {args.campaign}: no results yet in s3://{bucket}/")
        return 0
    console.print(_fetch_table(report))
    counts = ", ".join(
        f"{report.count(o)} {o}" for o in ("downloaded", "resumed", "skipped", "failed")
    )
    console.print(f"files: {counts}")
    for check in report.tarballs:
        for problem in check.problems:
            console.print(f"{check.shard}: tarball: {problem}", soft_wrap=True)
    console.print(f"results: {report.dest}", soft_wrap=True)
    return 0 if report.ok else 1


def _fetch_table(report: FetchReport) -> Table:
    table = Table(title=f"Campaign {report.campaign}: results")
    for column in ("shard", "downloaded", "resumed", "skipped", "failed", "MiB", "tarball"):
        table.add_column(column, justify="left" if column in {"shard", "tarball"} else "right")
    checks = {c.shard: c for c in report.tarballs}
    for shard in sorted(checks):
        files = [f for f in report.files if f.rel.startswith(f"{shard}/")]
        count = {o: sum(1 for f in files if f.outcome == o) for o in ("downloaded", "resumed")}
        check = checks[shard]
        if check.ok is None:
            verdict = "none yet"
        elif check.ok:
            verdict = f"verified ({check.members} files)"
        else:
            verdict = f"MISMATCH ({len(check.problems)} problems)"
        table.add_row(
            shard,
            str(count["downloaded"]),
            str(count["resumed"]),
            str(sum(1 for f in files if f.outcome == "skipped")),
            str(sum(1 for f in files if f.outcome == "failed")),
            f"{sum(f.size for f in files) / 2**20:,.1f}",
            verdict,
        )
    return table


# --- iam-policy ---


def _iam_policy(args: argparse.Namespace, clients: AwsClients, console: Console) -> int:
    from control.iam_policy import workstation_policy_json

    stack = find_stack(clients, args.stack)
    print(workstation_policy_json(stack, clients.region))
    return 0


# --- cleanup ---


def _cleanup(args: argparse.Namespace, clients: AwsClients, console: Console) -> int:
    try:
        stack = find_stack(clients, args.stack)
    except ControlError as exc:
        console.print(f"{exc}; looking for tagged instances anyway", soft_wrap=True)
        stack = None
    plan = plan_cleanup(clients, stack, campaign=args.campaign)
    if plan.items:
        console.print(_cleanup_table(plan))
    else:
        console.print("no instances tagged bench:campaign are running")
    if plan.empty:
        console.print("nothing to clean up")
        return 0
    question = (
        f"Terminate {len(plan.to_terminate)} instance(s) and delete "
        f"{len(plan.parameters)} status parameter(s)? [y/N] "
    )
    if not args.yes and not _confirm(question):
        console.print("nothing done")
        return 0
    done = apply_cleanup(clients, plan)
    for instance_id in done.terminated:
        console.print(f"terminating {instance_id}")
    for name in done.deleted:
        console.print(f"deleted {name}")
    return 0


def _confirm(question: str) -> bool:
    print(question, end="", flush=True)
    try:
        answer = sys.stdin.readline()
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if not answer.endswith("\n"):
        print()
    return answer.strip().lower() in {"y", "yes"}


def _cleanup_table(plan: CleanupPlan) -> Table:
    table = Table(title=f"Tagged instances at {datetime.now(UTC).strftime('%H:%M:%S UTC')}")
    for column in ("instance", "campaign", "shard", "type", "market", "state", "age", "action"):
        table.add_column(column, overflow="fold")
    for item in plan.items:
        i = item.instance
        action = f"terminate: {item.terminate}" if item.terminate else f"keep: {item.keep}"
        table.add_row(
            i.instance_id,
            i.campaign,
            i.shard or "-",
            i.instance_type,
            i.market,
            i.state,
            _duration(item.age),
            action,
        )
    if plan.parameters:
        table.caption = f"status parameters to delete: {', '.join(plan.parameters)}"
    return table
