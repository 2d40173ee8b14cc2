"""What the campaign cost: instance hours per shard at its price, and dollars per million
output tokens per sweep cell."""

from __future__ import annotations

from collections.abc import Sequence

from contract.spec import LOCAL_INSTANCE_TYPE
from report.load import ArmResults, CampaignResults, ShardResults
from report.prices import PriceBook
from report.rows import CostPoint, ShardCost, SweepGrid, usd_per_million

__all__ = ["cost_points", "shard_costs"]


def _shard_window(shard: ShardResults) -> tuple[float, float | None]:
    manifest = shard.manifest
    finished = manifest.finished_unix_s
    if finished is None:
        ends = [r.finished_unix_s for a in shard.arms for r in a.jobs.values()]
        finished = max(ends) if ends else None
    return manifest.started_unix_s, finished


def shard_costs(
    campaign: CampaignResults, prices: PriceBook, notes: list[str]
) -> tuple[list[ShardCost], dict[str, ShardCost]]:
    costs: list[ShardCost] = []
    for shard in campaign.shards:
        started, finished = _shard_window(shard)
        hours = (finished - started) / 3600.0 if finished else None
        install = sum(e.install_s or 0.0 for e in shard.manifest.engines) / 3600.0
        on_demand = spot = None
        region = shard.region
        if shard.instance_type != LOCAL_INSTANCE_TYPE:
            if region is None:
                region = "us-east-1"
                notes.append(
                    f"shard {shard.name}: no region in its manifest; us-east-1 prices assumed"
                )
            on_demand = prices.on_demand(shard.instance_type, region)
            if on_demand is None:
                notes.append(f"shard {shard.name}: no on-demand price for {shard.instance_type}")
            if shard.market == "spot":
                zone = shard.availability_zone
                if zone is None or finished is None:
                    notes.append(f"shard {shard.name}: spot, but no zone or end time recorded")
                else:
                    spot = prices.spot_paid(shard.instance_type, zone, started, finished)
        costs.append(
            ShardCost(
                shard=shard.name,
                instance_type=shard.instance_type,
                region=region,
                market=shard.market,
                started_unix_s=started,
                finished_unix_s=finished,
                hours=hours,
                install_hours=install,
                on_demand=on_demand,
                spot=spot,
            )
        )
    return costs, {c.shard: c for c in costs}


def cost_points(
    arms: Sequence[ArmResults], grids: Sequence[SweepGrid], by_shard: dict[str, ShardCost]
) -> list[CostPoint]:
    shard_of = {a.label: a.shard for a in arms}
    points = []
    for grid in grids:
        for label in grid.arms:
            cost = by_shard[shard_of[label]]
            for level in grid.levels:
                cell = grid.cells[(label, level)]
                if not cell.ranked or cell.tok_s is None:
                    continue
                points.append(
                    CostPoint(
                        label=label,
                        shard=cost.shard,
                        shape=grid.shape,
                        concurrency=level,
                        tok_s=cell.tok_s,
                        on_demand_usd_per_m=usd_per_million(cost.on_demand.usd_per_hour, cell.tok_s)
                        if cost.on_demand
                        else None,
                        spot_usd_per_m=usd_per_million(cost.spot.usd_per_hour_mean, cell.tok_s)
                        if cost.spot
                        else None,
                    )
                )
    return points
