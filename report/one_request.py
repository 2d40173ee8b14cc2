"""The one-request rows (the probe) and the drafter rows built on them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from contract import metrics
from contract.results import RequestRecord
from report.acceptance import acceptance_of
from report.arms import drafted_tokens, engine_groups, engine_name, is_drafter
from report.load import ArmResults, requests_path
from report.rows import DrafterRow, ProbeRow, Spread, beyond_spread

__all__ = ["drafter_rows", "probe_rows"]

_PROBE_LABEL = re.compile(r"^probe/p(\d+)/r(\d+)$")


def _probe_spread(path: Path | None) -> tuple[Spread | None, int]:
    """Geometric mean over prompts of each repeat, min to max; and the requests read."""
    if path is None:
        return None, 0
    by_repeat: dict[int, list[float]] = {}
    count = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        record = RequestRecord.model_validate_json(line)
        match = _PROBE_LABEL.match(record.label)
        if match is None or not record.ok:
            continue
        value = metrics.e2e_tok_s(record)
        if value is not None:
            by_repeat.setdefault(int(match.group(2)), []).append(value)
            count += 1
    means = [m for values in by_repeat.values() if (m := metrics.geometric_mean(values))]
    if not means:
        return None, count
    return Spread(min(means), max(means), len(means)), count


def probe_rows(arms: Sequence[ArmResults], baseline: ArmResults | None) -> list[ProbeRow]:
    base_summary = baseline.probe if baseline else None
    base_spread = (
        _probe_spread(requests_path(baseline, "probe"))[0] if baseline and base_summary else None
    )
    base_rel = (
        base_spread.relative(base_summary.e2e_tok_s) if base_spread and base_summary else None
    )
    rows = []
    for arm in arms:
        summary, record = arm.probe, arm.jobs.get("probe")
        if summary is None:
            rows.append(
                ProbeRow(
                    label=arm.label,
                    engine=engine_name(arm),
                    status=arm.status("probe") if arm.status("probe") != "ok" else "failed",
                    reason=arm.reason("probe") or ("no summary.json" if record else None),
                )
            )
            continue
        spread, _ = _probe_spread(requests_path(arm, "probe"))
        ratio = (
            summary.e2e_tok_s / base_summary.e2e_tok_s
            if summary.e2e_tok_s and base_summary and base_summary.e2e_tok_s
            else None
        )
        rel = spread.relative(summary.e2e_tok_s) if spread else None
        telemetry = arm.telemetry("probe")
        memory, kind = None, None
        if telemetry and telemetry.peak_gpu_memory_mib is not None:
            memory, kind = telemetry.peak_gpu_memory_mib, "gpu"
        elif telemetry and telemetry.engine_rss_mib_peak is not None:
            memory, kind = telemetry.engine_rss_mib_peak, "rss"
        measured = summary.settings.repeats * len(summary.prompts)
        rows.append(
            ProbeRow(
                label=arm.label,
                engine=engine_name(arm),
                status=arm.status("probe"),
                reason=arm.reason("probe"),
                e2e_tok_s=summary.e2e_tok_s,
                e2e_spread=spread,
                x_baseline=ratio,
                differs=None if arm is baseline else beyond_spread(ratio, rel, base_rel),
                decode_tok_s=summary.decode_tok_s,
                ttft_ms=summary.ttft_ms,
                at_once=summary.settings.at_once,
                at_once_tok_s=summary.at_once_aggregate_tok_s,
                x_one=summary.at_once_x_one,
                memory_mib=memory,
                memory_kind=kind,
                ready_s=record.ready_s if record else None,
                repeat_identical=summary.repeat_identical,
                prompts=len(summary.prompts),
                texts_sha256=summary.texts_sha256,
                requests_ok=measured + summary.settings.at_once - summary.requests_failed,
                requests_failed=summary.requests_failed,
            )
        )
    return rows


def drafter_rows(arms: Sequence[ArmResults], probe: Sequence[ProbeRow]) -> list[DrafterRow]:
    by_label = {r.label: r for r in probe}
    group = engine_groups(arms)
    engines: dict[str, list[ArmResults]] = {}
    for arm in arms:
        engines.setdefault(group(arm), []).append(arm)
    rows = []
    for engine, members in engines.items():
        plain = [a for a in members if not is_drafter(a)]
        drafted = [a for a in members if is_drafter(a)]
        # The plain arm: the one named like the engine's bare arm (shortest name) among
        # those that measured; the seeds have exactly one.
        plain_arm = min(
            plain, key=lambda a: (by_label[a.label].e2e_tok_s is None, len(a.arm)), default=None
        )
        plain_row = by_label[plain_arm.label] if plain_arm else None
        measured = [a for a in drafted if by_label[a.label].e2e_tok_s is not None]
        best = max(measured, key=lambda a: by_label[a.label].e2e_tok_s or 0.0, default=None)
        best_row = by_label[best.label] if best else None
        gain = (
            best_row.e2e_tok_s / plain_row.e2e_tok_s
            if best_row and plain_row and best_row.e2e_tok_s and plain_row.e2e_tok_s
            else None
        )
        shown = best or (drafted[0] if drafted else None)
        accepted = acceptance_of(shown) if shown else None
        rows.append(
            DrafterRow(
                engine=engine,
                plain=plain_arm.label if plain_arm else None,
                plain_tok_s=plain_row.e2e_tok_s if plain_row else None,
                plain_status=plain_row.status if plain_row else None,
                best=best.label if best else (drafted[0].label if drafted else None),
                best_tok_s=best_row.e2e_tok_s if best_row else None,
                tokens=drafted_tokens(best) if best else None,
                gain=gain,
                differs=beyond_spread(
                    gain,
                    best_row.relative_spread if best_row else None,
                    plain_row.relative_spread if plain_row else None,
                ),
                acceptance_rate=accepted.rate if accepted else None,
                mean_accepted_length=accepted.mean_accepted_length if accepted else None,
                acceptance_recorded=accepted is not None,
            )
        )
    return rows
