"""`bench sweep URL`: the load sweep against a running server, into `--out`; `--resume`
finishes an interrupted sweep cell by cell.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from agent.jobfolder import JobFolder
from agent.loadgen.arrivals import connections_for
from agent.loadgen.client import OpenAIClient
from agent.loadgen.sweep import count_requests, run_sweep
from agent.loadgen.text_sources import TextSource, load_source
from agent.telemetry.server_metrics import SERVER_METRICS_FILE, polling
from cli.outdir import nothing_left_unless_measured
from cli.parser import out_mode
from cli.rate_table import rate_table
from cli.standalone import (
    UserError,
    console,
    default_out,
    one_line,
    open_out,
    previous_summary,
    progress_bar,
    request_settings,
    write_standalone,
)
from contract.results import REQUESTS_FILE, VLLM_EXPORT_FILE, SweepSummary, in_cells
from contract.suite import Shape, SweepSettings
from report.console import print_tables, report_of, sweep_tables

__all__ = ["run_sweep_command"]


def parse_shapes(text: str) -> tuple[Shape, ...]:
    try:
        shapes = tuple(Shape.parse(s) for s in text.split(",") if s.strip())
    except ValueError as exc:
        raise UserError(f"--shapes: {one_line(exc)}") from exc
    if not shapes:
        raise UserError("--shapes: give at least one INPUT/OUTPUT shape, e.g. 512/128")
    return shapes


async def run_sweep_command(args: argparse.Namespace) -> int:
    if (args.mode == "rate") != bool(args.rates):
        raise UserError("--rates goes with --mode rate, and --mode rate needs --rates")
    try:
        settings = SweepSettings(
            shapes=parse_shapes(args.shapes),
            levels=args.levels,
            repeats=args.repeats,
            mode=args.mode,
            rates=args.rates or (),
            burstiness=args.burstiness,
            max_concurrency=args.max_concurrency,
            seed=args.seed,
            prompts=args.prompts,
            warmup=not args.no_warmup,
            steady_window_s=args.window_s,
            steady_warmup_s=args.warmup_s,
            max_cell_s=args.max_cell_s,
            slo_ttft_ms=args.slo_ttft_ms,
            slo_tpot_ms=args.slo_tpot_ms,
            request=request_settings(args),
        )
    except ValidationError as exc:
        raise UserError(one_line(exc)) from exc
    source = load_source(settings.prompts, gsm8k_data=args.gsm8k_data)
    out = args.out or default_out("sweep")
    mode = out_mode(args)
    previous = previous_summary(out, SweepSummary) if mode == "resume" else None
    if previous is not None and previous.settings != settings:
        raise UserError(f"--resume: {out} was swept with other settings; use --overwrite")
    screen = console()
    if previous is not None and previous.finished_unix_s is not None:
        return _show(screen, out, previous, " (already complete; nothing to resume)")
    async with OpenAIClient(
        args.url,
        model=args.model,
        settings=settings.request,
        transport=args.transport,
        max_connections=connections_for(settings),
    ) as client:
        aside = await open_out(client, out, mode, previous, screen)
        with nothing_left_unless_measured(
            out, aside, say=screen.print, unmeasured=(SERVER_METRICS_FILE,)
        ):
            summary = await _measure(client, settings, out, previous, source, screen)
    write_standalone(out, "sweep", summary.base_url, [summary.model], settings)
    return _show(screen, out, summary)


def _show(screen: Console, out: Path, summary: SweepSummary, note: str = "") -> int:
    """Print the sweep's tables; exit status 1 when a cell failed or lost requests."""
    if summary.settings.mode == "rate":
        screen.print(rate_table(summary))
    else:
        print_tables(screen, sweep_tables(report_of([out])))
    screen.print(f"results: {out}{note}")
    lost = summary.counts["failed"] + summary.counts.get("partial", 0)
    return 0 if lost == 0 else 1


async def _measure(
    client: OpenAIClient,
    settings: SweepSettings,
    out: Path,
    previous: SweepSummary | None,
    source: TextSource | None,
    screen: Console,
) -> SweepSummary:
    """Run (or finish) the sweep into `out`, the server's /metrics polled beside it."""
    writer = JobFolder(out)
    if previous is not None:
        done = {cell.label for cell in previous.cells}
        moved = writer.set_aside(REQUESTS_FILE, lambda row: _in_done(row, done))
        moved += writer.set_aside(VLLM_EXPORT_FILE, lambda row: _in_done(row, done))
        if moved:
            screen.print(f"set aside {moved} line(s) of the cell that was interrupted")
    total = count_requests(settings) if settings.mode == "burst" else None
    with (
        progress_bar(total, "sweep") as advance,
        polling(client.base_url, out / SERVER_METRICS_FILE, "sweep") as server_metrics,
    ):
        summary = await run_sweep(
            client,
            settings,
            writer,
            progress=advance,
            source=source,
            server_metrics=server_metrics,
            previous=previous,
        )
    return summary


def _in_done(row: dict[str, object], done: set[str]) -> bool:
    """Whether a requests.jsonl / vLLM export line belongs to a finished cell."""
    return in_cells(str(row.get("label", "")), done)
