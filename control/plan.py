"""`bench plan`: what a campaign will do, how long it will take and what it will cost, before
anything is launched.

Per shard, the jobs in the order the agent runs them (boot; per arm: the engine's install the
first time, the server's ready, then probe, sweep, GSM8K, BFCL; the upload), each with its
estimated hours and the prior it comes from (`control.priors`: the seeds' measured timings,
and the suite's own sizes). A shard's hours times its type's on-demand price (the AWS Price
List when credentials exist, else the dated table, named) and the current spot price (EC2's
spot price history, credentials only) give its dollars; shards run in parallel, so the
campaign's wall time is its longest shard's, and its instance-hours are their sum.

Engine facts (which engine an arm runs, whether it drafts) come from the caller: the recipes
are `engines/`, which this room does not import (`cli/` passes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from contract.gpus import gpu_family
from contract.prices import HourlyPrice
from contract.spec import CampaignSpec, ShardSpec
from contract.suite import SweepSettings
from control import priors
from control.priors import Prior

__all__ = [
    "ArmInfo",
    "CampaignPlan",
    "PlanPrices",
    "ShardPlan",
    "SpotNow",
    "Step",
    "plan_campaign",
]


@dataclass(frozen=True, slots=True)
class ArmInfo:
    """What the plan needs to know of an arm (from its engine's recipe).

    Attributes:
        arm: the arm's name.
        engine: its engine's name (the recipes' names: vllm, llamacpp ...).
        drafter: a drafter arm.
        version: the engine version the campaign installs.
    """

    arm: str
    engine: str
    drafter: bool
    version: str


@dataclass(frozen=True, slots=True)
class SpotNow:
    """The spot price now, in the cheapest zone asked about."""

    usd_per_hour: float
    availability_zone: str
    source: str


class PlanPrices(Protocol):
    """Where a plan gets prices; `notes` says which were used and what went wrong."""

    notes: list[str]

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None: ...

    def spot_now(self, instance_type: str, region: str) -> SpotNow | None: ...


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a shard, in order.

    Attributes:
        what: e.g. "install vllm 0.33.0", "sweep vllm-d4".
        hours: its estimate.
        source: the priors it comes from.
    """

    what: str
    hours: float
    source: str


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One shard's plan.

    Attributes:
        shard: its name.
        instance_type: its EC2 type.
        gpu: the GPU it carries.
        steps: what it does, in order.
        on_demand: its type's on-demand price (None where neither AWS nor the table has it).
        spot: the current spot price (None without credentials).
    """

    shard: str
    instance_type: str
    gpu: str
    steps: tuple[Step, ...]
    on_demand: HourlyPrice | None
    spot: SpotNow | None

    @property
    def hours(self) -> float:
        return sum(step.hours for step in self.steps)

    @property
    def usd_on_demand(self) -> float | None:
        return None if self.on_demand is None else self.hours * self.on_demand.usd_per_hour

    @property
    def usd_spot(self) -> float | None:
        return None if self.spot is None else self.hours * self.spot.usd_per_hour


@dataclass(frozen=True, slots=True)
class CampaignPlan:
    """A campaign's plan.

    Attributes:
        campaign: its name.
        region: the region it is priced in.
        max_runtime_h: the spec's limit per instance.
        shards: one plan per shard, in spec order.
        notes: where the prices came from, and what could not be priced.
    """

    campaign: str
    region: str
    max_runtime_h: float
    shards: tuple[ShardPlan, ...]
    notes: tuple[str, ...]

    @property
    def wall_hours(self) -> float:
        """Shards run in parallel: the longest one."""
        return max((s.hours for s in self.shards), default=0.0)

    @property
    def instance_hours(self) -> float:
        return sum(s.hours for s in self.shards)

    @property
    def usd_on_demand(self) -> float | None:
        values = [s.usd_on_demand for s in self.shards]
        return None if any(v is None for v in values) else sum(v for v in values if v)

    @property
    def usd_spot(self) -> float | None:
        values = [s.usd_spot for s in self.shards]
        return None if any(v is None for v in values) else sum(v for v in values if v)

    def problems(self) -> list[str]:
        """One line per shard that would be cut off by the spec's `max_runtime_h`."""
        return [
            f"shard {s.shard}: planned {s.hours:.1f} h is beyond max_runtime_h "
            f"{self.max_runtime_h:g}; the instance would end first (raise max_runtime_h or "
            "split the shard)"
            for s in self.shards
            if s.hours > self.max_runtime_h
        ]


def plan_campaign(
    spec: CampaignSpec,
    arms: Mapping[str, ArmInfo],
    prices: PlanPrices,
    *,
    region: str,
    probe_prompts: int,
) -> CampaignPlan:
    """The plan of a checked spec.

    Args:
        spec: the campaign (checked against the recipes).
        arms: every arm of the spec's shards, described.
        prices: where prices come from.
        region: where it is priced.
        probe_prompts: prompts the probe sends per repeat (the agent's probe set).
    """
    shards = tuple(
        _plan_shard(spec, shard, arms, prices, region, probe_prompts) for shard in spec.shards
    )
    return CampaignPlan(spec.name, region, spec.max_runtime_h, shards, tuple(prices.notes))


def _plan_shard(
    spec: CampaignSpec,
    shard: ShardSpec,
    arms: Mapping[str, ArmInfo],
    prices: PlanPrices,
    region: str,
    probe_prompts: int,
) -> ShardPlan:
    family = gpu_family(shard.instance_type)
    gpu = family.gpu if family is not None else "unknown GPU"
    steps = [_step("boot and agent setup", priors.BOOT)]
    installed: set[str] = set()
    suite = spec.suite
    for name in shard.arms:
        arm = arms[name]
        if arm.engine not in installed:
            installed.add(arm.engine)
            steps.append(_step(f"install {arm.engine} {arm.version}", priors.install(arm.engine)))
        steps.append(_step(f"ready {name}", priors.ready(gpu, arm.engine)))
        one = priors.single_tok_s(gpu, arm.engine, arm.drafter)
        if suite.probe is not None:
            probe = suite.probe
            requests = probe_prompts * probe.repeats + probe.at_once
            seconds = requests * probe.output_tokens / one.value
            source = (
                f"{requests} requests x {probe.output_tokens} tokens, one at a time, at "
                f"{one.source}"
            )
            steps.append(Step(f"probe {name}", seconds / 3600, source))
        if suite.sweep is not None:
            seconds, source = _sweep_s(suite.sweep, gpu, arm)
            steps.append(Step(f"sweep {name}", seconds / 3600, source))
        if suite.gsm8k is not None:
            questions = suite.gsm8k.limit or priors.GSM8K_QUESTIONS
            each = priors.gsm8k_per_question(gpu, arm.engine, arm.drafter)
            steps.append(
                Step(
                    f"gsm8k {name}",
                    questions * each.value / 3600,
                    f"{questions} questions x {each.value:.2f} s ({each.source})",
                )
            )
        if suite.bfcl is not None:
            questions = suite.bfcl.limit or priors.BFCL_QUESTIONS
            each = priors.bfcl_per_question(gpu, arm.engine, arm.drafter)
            steps.append(
                Step(
                    f"bfcl {name}",
                    questions * each.value / 3600,
                    f"{questions} questions x {each.value:.2f} s ({each.source})",
                )
            )
    steps.append(_step("upload and power-off", priors.UPLOAD))
    return ShardPlan(
        shard=shard.name,
        instance_type=shard.instance_type,
        gpu=gpu,
        steps=tuple(steps),
        on_demand=prices.on_demand(shard.instance_type, region),
        spot=prices.spot_now(shard.instance_type, region),
    )


def _step(what: str, prior: Prior) -> Step:
    return Step(what, prior.value / 3600, prior.source)


def _sweep_s(sweep: SweepSettings, gpu: str, arm: ArmInfo) -> tuple[float, str]:
    """Every cell's windows (repeats, plus the warm-up) at the interpolated aggregate rate;
    steady mode: its fixed windows."""
    windows = sweep.repeats + (1 if sweep.warmup else 0)
    total = 0.0
    sources: list[str] = []
    for shape in sweep.shapes:
        long_replies = shape.output_tokens >= shape.input_tokens
        for level in sweep.levels:
            rate = priors.sweep_tok_s(gpu, arm.engine, level, long_replies)
            if sweep.mode == "steady":
                cell = sweep.steady_warmup_s + sweep.repeats * sweep.steady_window_s
            else:
                cell = windows * shape.output_tokens * level / rate.value
            total += min(cell, sweep.max_cell_s)
            if rate.source not in sources:
                sources.append(rate.source)
    cells = len(sweep.shapes) * len(sweep.levels)
    head = f"{cells} cells x {windows} windows ({sweep.mode}); " + "; ".join(sources)
    return total, head

