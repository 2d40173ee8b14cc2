"""`build_report`: every table's rows for one campaign, from the row builders.

Every number is read from a summary the agent wrote, or is the documented arithmetic on such
numbers: a ratio of two of them, a price divided by a throughput, an energy divided by
tokens. Statistics that need the raw records are computed by the code that defines them.
The rows and the spread rule are in `report.rows`; each section's builder in its module.
"""

from __future__ import annotations

from contract.suite import EVAL_ITEMS
from report.accuracy import accuracy_rows, eval_time_rows
from report.costs import cost_points, shard_costs
from report.energy import energy_rows
from report.load import CampaignResults, ResultsError
from report.one_request import drafter_rows, probe_rows
from report.prices import PriceBook
from report.rate import rate_rows
from report.rows import Report, Slo
from report.scope import not_measured, scope_lines
from report.server import wait_rows
from report.sites import cross_rows, site_rows, sites, use_cases
from report.slo import resolve_slo, slo_rows
from report.sweep import best_rows, sweep_grids

__all__ = ["build_report"]


def build_report(
    campaign: CampaignResults,
    prices: PriceBook,
    *,
    baseline: str | None = None,
    slo: Slo | None = None,
) -> Report:
    """Every table's rows for one campaign; `baseline` names the arm ratios are taken to;
    each objective `slo` gives replaces the spec's.

    Raises:
        ResultsError: `baseline` is not an arm of the campaign.
    """
    arms = campaign.arms()
    labels = [a.label for a in arms]
    if baseline is None:
        base = next((a for a in arms if a.probe is not None), arms[0] if arms else None)
    else:
        base = campaign.arm(baseline)
        if base is None:
            raise ResultsError(f"--baseline {baseline!r} is not an arm here ({', '.join(labels)})")
    spec = campaign.shards[0].manifest.campaign
    probe = probe_rows(arms, base)
    drafters = drafter_rows(arms, probe)
    flags = slo or Slo()
    objectives = resolve_slo(
        spec.suite.sweep, ttft_ms=flags.ttft_ms, tpot_ms=flags.tpot_ms, e2el_ms=flags.e2el_ms
    )
    grids = sweep_grids(arms, campaign, objectives)
    best, engines = best_rows(arms, grids)
    items = [i for i in EVAL_ITEMS if i in spec.suite.items()]
    items += [i for i in EVAL_ITEMS if i not in items and any(i in a.evals for a in arms)]
    accuracy = accuracy_rows(arms, base, items)
    notes: list[str] = []
    costs, by_shard = shard_costs(campaign, prices, notes)
    energy_cells, job_energy, sampled = energy_rows(campaign, grids)
    points = cost_points(arms, grids, by_shard)
    best_sites = site_rows(arms, probe, grids, points) if len(sites(arms)) > 1 else []
    return Report(
        campaign=campaign.campaign,
        description=spec.description,
        baseline=base.label if base else "-",
        arms=labels,
        probe=probe,
        drafters=drafters,
        sweeps=grids,
        best=best,
        engines=engines,
        accuracy=accuracy,
        eval_times=eval_time_rows(arms),
        shard_costs=costs,
        cost_points=points,
        energy_cells=energy_cells,
        job_energy=job_energy,
        gpu_sampled=sampled,
        scope=scope_lines(campaign),
        not_measured=not_measured(campaign, arms, grids, accuracy, sampled),
        price_notes=[*prices.notes, *notes],
        problems=list(campaign.problems),
        results=campaign,
        shapes=[g.shape for g in grids],
        slo=objectives,
        slo_rows=slo_rows(arms, grids, points, energy_cells, objectives),
        cross=cross_rows(arms, probe, grids),
        site_best=best_sites,
        use_cases=use_cases(best_sites) if len(sites(arms)) > 1 else [],
        waits=wait_rows(campaign, [g.shape for g in grids]),
        rates=rate_rows(arms),
    )
