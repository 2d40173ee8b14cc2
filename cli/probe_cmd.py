"""`bench probe URL`: the one-request probe against a running server, into `--out`."""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from cli.parser import out_mode
from cli.standalone import (
    UserError,
    console,
    default_out,
    one_line,
    previous_summary,
    progress_bar,
    request_settings,
    write_standalone,
)

__all__ = ["run_probe_command"]


async def run_probe_command(args: argparse.Namespace) -> int:
    from agent.loadgen.client import OpenAIClient
    from agent.loadgen.probe import PROBE_PROMPTS, run_probe
    from agent.results import ResultWriter
    from cli.outdir import move_aside, prepare_out
    from contract.results import ProbeSummary
    from contract.suite import ProbeSettings
    from report.console import print_tables, probe_table, report_of

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
    if mode == "resume":
        previous = previous_summary(out, ProbeSummary)
        if previous.settings != settings:
            raise UserError(f"--resume: {out} was probed with other settings; use --overwrite")
        if previous.finished_unix_s is not None:
            print_tables(screen, [probe_table(report_of([out]))])
            screen.print(f"results: {out} (already complete; nothing to resume)")
            return 0 if previous.requests_failed == 0 else 1
    total = settings.repeats * len(PROBE_PROMPTS) + settings.at_once
    async with OpenAIClient(
        args.url,
        model=args.model,
        settings=settings.request,
        transport=args.transport,
        max_connections=settings.at_once,
    ) as client:
        await client.server_info()  # unreachable: one line, and no folder left behind
        # A probe is one short unit: an unfinished one is moved aside and run again.
        aside = move_aside(out) if mode == "resume" else prepare_out(out, mode)
        if aside:
            screen.print(f"earlier results moved to {aside}")
        writer = ResultWriter(out)
        with progress_bar(total, "probe") as advance:
            summary = await run_probe(client, settings, writer, progress=advance)
    write_standalone(out, "probe", summary.base_url, [summary.model], settings)
    print_tables(screen, [probe_table(report_of([out]))])
    screen.print(f"results: {out}")
    return 0 if summary.requests_failed == 0 else 1
