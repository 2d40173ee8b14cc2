"""`bench probe URL`: the one-request probe against a running server, into `--out`;
`--resume` finishes an interrupted probe, keeping the requests it had finished.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.probe import probe_request_count, resumable, run_probe
from agent.telemetry.server_metrics import SERVER_METRICS_FILE, polling
from cli.outdir import nothing_left_unless_measured
from cli.parser import out_mode
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
from contract.results import REQUESTS_FILE, ProbeSummary, RequestRecord
from contract.suite import ProbeSettings
from report.console import print_tables, probe_table, report_of

__all__ = ["run_probe_command"]


async def run_probe_command(args: argparse.Namespace) -> int:
    try:
        settings = ProbeSettings(
            output_tokens=args.output_tokens,
            repeats=args.repeats,
            at_once=args.at_once,
            request=request_settings(args),
        )
    except ValidationError as exc:
        raise UserError(one_line(exc)) from exc
    out = args.out or default_out("probe")
    mode = out_mode(args)
    screen = console()
    previous = previous_summary(out, ProbeSummary) if mode == "resume" else None
    if previous is not None:
        if previous.settings != settings:
            raise UserError(f"--resume: {out} was probed with other settings; use --overwrite")
        if previous.finished_unix_s is not None:
            print_tables(screen, [probe_table(report_of([out]))])
            screen.print(f"results: {out} (already complete; nothing to resume)")
            return 0 if previous.requests_failed == 0 else 1
    async with OpenAIClient(
        args.url,
        model=args.model,
        settings=settings.request,
        transport=args.transport,
        max_connections=settings.at_once,
    ) as client:
        aside = await open_out(client, out, mode, previous, screen)
        with nothing_left_unless_measured(
            out, aside, say=screen.print, unmeasured=(SERVER_METRICS_FILE,)
        ):
            summary = await _measure(client, settings, out, previous, screen)
    write_standalone(out, "probe", summary.base_url, [summary.model], settings)
    print_tables(screen, [probe_table(report_of([out]))])
    screen.print(f"results: {out}")
    return 0 if summary.requests_failed == 0 else 1


async def _measure(
    client: OpenAIClient,
    settings: ProbeSettings,
    out: Path,
    previous: ProbeSummary | None,
    screen: Console,
) -> ProbeSummary:
    """Run (or finish) the probe into `out`."""
    writer = JobFolder(out)
    done: list[RequestRecord] = []
    if previous is not None:
        path = out / REQUESTS_FILE
        lines = path.read_bytes().splitlines() if path.exists() else []
        done = resumable(_records(lines), settings)
        keep = {r.request_id for r in done}
        moved = writer.set_aside(REQUESTS_FILE, lambda row: row.get("request_id") in keep)
        screen.print(
            f"resuming: {len(done)} of {probe_request_count(settings)} request(s) kept"
            + (f", {moved} line(s) set aside" if moved else "")
        )
    with (
        progress_bar(probe_request_count(settings), "probe") as advance,
        polling(client.base_url, out / SERVER_METRICS_FILE, "probe"),
    ):
        return await run_probe(
            client, settings, writer, progress=advance, previous=previous, done=done
        )


def _records(lines: list[bytes]) -> list[RequestRecord]:
    """The records among `lines`; a torn last line (a crash mid-write) is not one."""
    records = []
    for line in lines:
        try:
            records.append(RequestRecord.model_validate_json(line))
        except ValidationError:
            continue
    return records
