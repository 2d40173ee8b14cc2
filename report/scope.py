"""The report's scope (what ran where, with which versions and settings) and its caveats."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from contract.gpus import gpu_family
from contract.suite import EVAL_ITEMS
from report.arms import ENGINE_NAMES
from report.load import ArmResults, CampaignResults, ShardResults
from report.rows import AccuracyRow, SweepGrid

__all__ = ["not_measured", "scope_lines"]


def _when(unix_s: float | None) -> str:
    if unix_s is None:
        return "unfinished"
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M UTC")


def scope_lines(campaign: CampaignResults) -> list[str]:
    """Per results folder (one, or each of several) its campaign, shards and suite."""
    groups: dict[tuple[str, str], list[ShardResults]] = {}
    for shard in campaign.shards:
        groups.setdefault((shard.site, shard.manifest.campaign.name), []).append(shard)
    lines = []
    for (site, _), shards in groups.items():
        lines += _campaign_lines(shards, site)
    return lines


def _campaign_lines(shards: Sequence[ShardResults], site: str) -> list[str]:
    lines = []
    spec = shards[0].manifest.campaign
    model = spec.model.name + (f" with drafter {spec.drafter.name}" if spec.drafter else "")
    folder = f"Folder @{site}: c" if site else "C"
    lines.append(
        f"{folder}ampaign {spec.name}: {spec.description or 'no description'}; model {model}."
    )
    for shard in shards:
        m = shard.manifest
        gpus = sorted({g.name for g in m.gpus})
        family = gpu_family(shard.instance_type)
        gpu = ", ".join(gpus) or (
            f"{family.gpu} expected for {shard.instance_type}, but none was sampled"
            if family
            else "none (CPU only)"
        )
        where = shard.instance_type
        if shard.market:
            where += f" {shard.market}"
        if shard.availability_zone:
            where += f" in {shard.availability_zone}"
        host = m.host
        lines.append(
            f"Shard {shard.name}: {where}; GPU {gpu}; driver {m.nvidia_driver or '-'}, "
            f"CUDA {m.cuda or '-'}; host {host.cpu}, {host.cpus} CPUs, "
            f"{host.memory_mib:,} MiB RAM, {host.os}; agent {m.agent_version} "
            f"(git {(m.git_sha or 'unknown')[:12]}); ran {_when(m.started_unix_s)} to "
            f"{_when(m.finished_unix_s)}."
        )
        shown = {a.arm: a.display_name for a in m.arms}
        for engine in m.engines:
            name = shown.get(engine.arm) or ENGINE_NAMES.get(engine.engine, engine.engine)
            lines.append(
                f"  {engine.arm}: {name} "
                f"{engine.version} (build {engine.build_id}, variant {engine.variant}), "
                f"model {engine.model}" + (f", drafter {engine.drafter}" if engine.drafter else "")
            )
    suite = spec.suite
    if suite.probe:
        p = suite.probe
        lines.append(
            f"One request: 6 prompts x {p.repeats} repeats of {p.output_tokens} output tokens "
            f"(per prompt the median, across prompts the geometric mean), then {p.at_once} "
            "at once."
        )
    if suite.sweep:
        s = suite.sweep
        lines.append(
            f"Load: shapes {', '.join(sh.name for sh in s.shapes)} at "
            f"{', '.join(map(str, s.levels))} requests, {s.mode} mode, {s.repeats} repeats "
            "per cell (median shown, min-max in brackets), unique nonce-first prompts."
        )
    for name, settings in (("GSM8K", suite.gsm8k), ("BFCL simple", suite.bfcl)):
        if settings:
            amount = f"first {settings.limit}" if settings.limit else "all"
            lines.append(
                f"{name}: {amount} questions, one pass per arm, {settings.max_tokens}-token cap, "
                "greedy, thinking off."
            )
    return lines


def not_measured(
    campaign: CampaignResults,
    arms: Sequence[ArmResults],
    grids: Sequence[SweepGrid],
    accuracy: dict[str, list[AccuracyRow]],
    gpu_sampled: bool,
) -> list[str]:
    lines = []
    spec = campaign.shards[0].manifest.campaign
    for arm in arms:
        if not arm.ran:
            lines.append(f"{arm.label}: listed in the campaign, no results (not run or lost).")
        for item, record in arm.jobs.items():
            if record.status == "failed":
                lines.append(f"{arm.label} {item}: failed: {record.reason or 'no reason'}.")
    for grid in grids:
        off = [c for c in grid.cells.values() if c.status in ("infeasible", "failed", "not run")]
        if off:
            parts = ", ".join(f"{c.label} at {c.concurrency} ({c.status})" for c in off[:8]) + (
                f" and {len(off) - 8} more" if len(off) > 8 else ""
            )
            lines.append(f"{grid.shape}: cells without a figure: {parts}.")
        partial = [c for c in grid.cells.values() if c.status == "partial"]
        if partial:
            parts = ", ".join(
                f"{c.label} at {c.concurrency} ({c.requests_failed} failed)" for c in partial[:8]
            )
            lines.append(
                f"{grid.shape}: partial cells (requests failed, figure shown with the loss, "
                f"left out of best-per-level and cost): {parts}"
                + (f" and {len(partial) - 8} more." if len(partial) > 8 else ".")
            )
    for item in EVAL_ITEMS:
        if item not in spec.suite.items():
            lines.append(f"{item}: not in this campaign's suite.")
    if accuracy:
        lines.append(
            "Accuracy: one pass per arm, so no run-to-run range was measured; 'level' means "
            "the paired 95% interval of the difference contains zero."
        )
    if not gpu_sampled:
        lines.append(
            "No GPU was sampled (no NVML): GPU memory, power and energy were not measured; "
            "the memory column shows the engine's resident memory instead, marked RSS."
        )
    lines.append(
        "Costs are arithmetic from prices and measured throughput, not a bill: instance "
        "hours run from the agent's start to its end (boot before it, storage, transfer "
        "and S3 are not counted)."
    )
    lines.append(
        "Energy is the GPU's own counter only (no CPU, memory or host power); per-level "
        "figures include up to one 100 ms sample of idle time at each window edge."
    )
    return lines
