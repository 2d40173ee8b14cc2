"""`bench plan SPEC`: the campaign's jobs, hours and dollars, and whether it can launch.

Works with no credentials (priors, the dated price table, the pin check on PyPI); with
credentials it also prices from AWS and runs the pre-launch checks `bench launch` runs
(`control.preflight`). Every problem is one line; exit status 1 if there is any, 2 for a
spec or flag the user must fix, 0 otherwise. Nothing is launched.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from rich.console import Console
from rich.table import Table

from control.aws import AwsClients
from control.errors import ControlError
from control.plan import ArmInfo, CampaignPlan, PlanPrices, plan_campaign
from control.prices import AwsPlanPrices, TablePlanPrices
from control.spec import CampaignSpec, SpecError, load_spec_file

__all__ = ["arm_infos", "run_plan"]

DEFAULT_REGION = "us-east-1"  # the dated table's region


def arm_infos(spec: CampaignSpec) -> dict[str, ArmInfo]:
    """Each arm's engine, drafter and version, from the recipes (the spec is checked)."""
    from engines.campaign import campaign_recipe
    from engines.recipes import parse_arm

    infos: dict[str, ArmInfo] = {}
    for shard in spec.shards:
        for arm in shard.arms:
            recipe = campaign_recipe(spec, arm)
            parsed = parse_arm(recipe, arm)
            infos[arm] = ArmInfo(arm, recipe.name, parsed.drafter, recipe.version)
    return infos


def run_plan(args: argparse.Namespace) -> int:
    from agent.loadgen.probe import PROBE_PROMPTS
    from contract.prices import PriceError, TablePrices
    from engines.campaign import check_campaign
    from report.prices import DEFAULT_TABLE

    for name in ("botocore", "boto3", "urllib3"):
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console(highlight=False, soft_wrap=True)
    try:
        spec, _ = load_spec_file(args.spec, check=check_campaign)
        table = TablePrices(args.price_table or DEFAULT_TABLE)
    except (SpecError, PriceError) as exc:
        print(f"bench plan: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    problems: list[str] = []
    notes: list[str] = []
    clients = _clients(args, notes)
    region = args.region or (clients.region if clients else None)
    region = region or os.environ.get("AWS_REGION") or DEFAULT_REGION
    prices: PlanPrices
    if clients is None:
        prices = TablePlanPrices(table)
    else:
        from control.preflight import preflight

        checks = preflight(clients, args.stack, spec, public_sources=args.public_sources)
        problems += checks.problems
        notes += checks.notes
        notes += [f"WARNING: {w}" for w in checks.warnings]
        prices = AwsPlanPrices(clients, table, zones=checks.zones)
    plan = plan_campaign(
        spec, arm_infos(spec), prices, region=region, probe_prompts=len(PROBE_PROMPTS)
    )
    problems += plan.problems()
    if args.pin_check:
        problems += _pin_problems(spec, notes)
    _print_plan(console, plan)
    for note in notes:
        console.print(f"note: {note}", markup=False)
    for problem in problems:
        console.print(f"PROBLEM: {problem}", markup=False)
    if problems:
        console.print(f"{len(problems)} problem(s): `bench launch` would stop before launching")
        return 1
    console.print("no problem found: nothing launched; `bench launch` starts it")
    return 0


def _clients(args: argparse.Namespace, notes: list[str]) -> AwsClients | None:
    if args.offline:
        notes.append("--offline: AWS not asked; pre-launch checks not run")
        return None
    try:
        return AwsClients.from_environment(region=args.region)
    except ControlError as exc:
        notes.append(f"{exc}; prices from the dated table, pre-launch checks not run")
        return None


def _pin_problems(spec: CampaignSpec, notes: list[str]) -> list[str]:
    from engines.pins import check_pins

    try:
        checks = check_pins([spec])
    except OSError as exc:
        notes.append(f"engine pins not checked: {exc}")
        return []
    for check in checks:
        if check.ok:
            notes.append(f"pin {check.line()}")
    return [f"pin {check.line()}" for check in checks if not check.ok]


def _hours(hours: float) -> str:
    return f"{hours:.2f}"


def _usd(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def _print_plan(console: Console, plan: CampaignPlan) -> None:
    for shard in plan.shards:
        table = Table(title=f"Shard {shard.shard}: {shard.instance_type} ({shard.gpu})")
        table.add_column("#", justify="right")
        table.add_column("step")
        table.add_column("hours", justify="right")
        table.add_column("prior", overflow="fold")
        for i, step in enumerate(shard.steps, start=1):
            table.add_row(str(i), step.what, _hours(step.hours), step.source)
        od = shard.on_demand
        od_text = (
            f"on-demand ${od.usd_per_hour:.4f}/h ({od.source}) -> {_usd(shard.usd_on_demand)}"
            if od
            else "on-demand: no price"
        )
        sp = shard.spot
        sp_text = (
            f"spot now ${sp.usd_per_hour:.4f}/h ({sp.source}) -> {_usd(shard.usd_spot)}"
            if sp
            else "spot: n/a"
        )
        table.caption = f"{_hours(shard.hours)} h; {od_text}; {sp_text}"
        console.print(table)
    totals = Table(title=f"Campaign {plan.campaign} ({plan.region})")
    for column in ("shards", "wall hours", "instance-hours", "on-demand $", "spot $ now"):
        totals.add_column(column, justify="right")
    totals.add_row(
        str(len(plan.shards)),
        _hours(plan.wall_hours),
        _hours(plan.instance_hours),
        _usd(plan.usd_on_demand),
        _usd(plan.usd_spot),
    )
    console.print(totals)
    console.print(
        f"max_runtime_h {plan.max_runtime_h:g} per instance; shards run in parallel, one "
        "instance each",
        markup=False,
    )

