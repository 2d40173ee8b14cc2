"""`bench`: the one console script. Parses flags, calls the parts, prints short tables.

Imports of heavy parts happen inside each command so `bench --help` stays instant.
Expected failures (contract.errors.BenchError) are printed as one line on stderr with exit
status 2; anything else is a bug and shows its traceback, saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from contract.errors import BenchError
from contract.layout import STACK_NAME

if TYPE_CHECKING:
    from cli.outdir import OutMode
    from contract.suite import Shape

__all__ = ["main"]

CAMPAIGN_COMMANDS = ("launch", "status", "fetch", "cleanup", "iam-policy")
STACK_ENV = "BENCH_STACK"  # overrides the stack name, as --stack does
_S = TypeVar("_S", bound=BaseModel)


class UserError(BenchError):
    """A problem with what the user asked for: printed as one line, exit status 2."""


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc


def _csv_floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_request_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url", help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--model", help="model id to request (default: the first in /v1/models)")
    parser.add_argument(
        "--out", type=Path, help="results folder (default: ./results/<kind>-<time>)"
    )
    parser.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="/v1/chat/completions or /v1/completions (default: chat)",
    )
    parser.add_argument(
        "--force-output",
        choices=("ignore_eos+min_tokens", "ignore_eos", "min_tokens", "none"),
        default="ignore_eos+min_tokens",
        help="how the exact output length is requested; recorded per request",
    )
    parser.add_argument(
        "--thinking",
        action="store_true",
        help="send chat_template_kwargs.enable_thinking=true (default: false, sent explicitly)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument(
        "--extra-body",
        type=_json_object,
        default={},
        help="JSON merged into every request body, e.g. '{\"cache_prompt\": false}'",
    )
    parser.add_argument(
        "--transport",
        choices=("fast", "httpx"),
        default="fast",
        help="hot-path HTTP client: fast (asyncio+httptools, default) or httpx",
    )
    _add_out_mode_flags(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_out_mode_flags(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume",
        action="store_true",
        help="finish the run already in --out (same settings required); done parts are kept",
    )
    mode.add_argument(
        "--overwrite",
        action="store_true",
        help="move what --out holds aside (to <out>.replaced-<time>) and start again",
    )


def _out_mode(args: argparse.Namespace) -> OutMode:
    return "resume" if args.resume else "overwrite" if args.overwrite else "new"


def _request_settings(args: argparse.Namespace):
    from contract.suite import RequestSettings

    return RequestSettings(
        endpoint=args.endpoint,
        force_output=args.force_output,
        thinking=args.thinking,
        timeout_s=args.timeout_s,
        extra_body=args.extra_body,
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench",
        description="Benchmark LLM serving engines: one-request probe, load sweep, campaigns.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    probe = sub.add_parser(
        "probe",
        help="one-request probe against a running server",
        description="Six fixed chat prompts, each alone N times, then K at once (the seeds' "
        "one-request table).",
    )
    _add_request_flags(probe)
    probe.add_argument("--output-tokens", type=int, default=256, help="tokens per reply (256)")
    probe.add_argument("--repeats", type=int, default=3, help="repeats per prompt (3)")
    probe.add_argument("--at-once", type=int, default=4, help="requests sent together (4)")

    sweep = sub.add_parser(
        "sweep",
        help="load sweep against a running server",
        description="Every shape at every concurrency level, repeated; unique nonce-first "
        "prompts of exact length; cells ok / infeasible / failed.",
    )
    _add_request_flags(sweep)
    sweep.add_argument(
        "--shapes",
        default="512/128,128/512",
        help="comma-separated INPUT/OUTPUT token shapes (512/128,128/512)",
    )
    sweep.add_argument(
        "--levels",
        type=_csv_ints,
        default=(1, 2, 4, 8, 16, 32, 64),
        help="comma-separated concurrency levels (1,2,4,8,16,32,64)",
    )
    sweep.add_argument("--repeats", type=int, default=5, help="measured windows per cell (5)")
    sweep.add_argument(
        "--mode",
        choices=("burst", "steady", "rate"),
        default="burst",
        help="burst: N released at once (the seeds'); steady: N kept in flight for a window; "
        "rate: requests arrive at --rates per second for a window",
    )
    sweep.add_argument(
        "--rates", type=_csv_floats, help="rate: comma-separated requests per second, e.g. 1,2,4,8"
    )
    sweep.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="rate: gamma shape of the gaps between arrivals; 1 = Poisson, <1 burstier (1)",
    )
    sweep.add_argument("--max-concurrency", type=int, help="rate: cap on requests in flight")
    sweep.add_argument("--seed", type=int, default=0, help="rate: arrival process seed (0)")
    sweep.add_argument(
        "--prompts",
        default="synthetic",
        help="prompt text: synthetic (shuffled filler words), gsm8k, bfcl or jsonl:PATH "
        "(lines of text or {\"text\": ...}); nonce first, exact length either way (synthetic)",
    )
    sweep.add_argument(
        "--gsm8k-data",
        type=Path,
        help="--prompts gsm8k: a local copy of the GSM8K test split (else downloaded, "
        "sha256-pinned)",
    )
    sweep.add_argument("--no-warmup", action="store_true", help="skip the unmeasured warm-up")
    sweep.add_argument(
        "--window-s", type=float, default=30.0, help="steady, rate: window length (s)"
    )
    sweep.add_argument(
        "--warmup-s", type=float, default=5.0, help="steady, rate: warm-up before it (s)"
    )
    sweep.add_argument("--max-cell-s", type=float, default=1800.0, help="time bound per cell (s)")
    sweep.add_argument("--slo-ttft-ms", type=float, help="goodput: TTFT objective (ms)")
    sweep.add_argument("--slo-tpot-ms", type=float, help="goodput: TPOT objective (ms)")

    run = sub.add_parser(
        "run",
        help="run a campaign on this machine (default: the embedded local campaign)",
        description="Runs every shard of a campaign spec here, with no cloud: installs each "
        "engine from its recipe, serves, measures, stops. With no SPEC: our PyTorch engine "
        "and llama.cpp (built once, cached) on tiny generated models.",
    )
    run.add_argument(
        "spec",
        nargs="?",
        type=Path,
        help="campaign TOML (default: the embedded agent/campaigns/local.toml)",
    )
    run.add_argument("--out", type=Path, default=Path("results"), help="results root (./results)")
    run.add_argument(
        "--gsm8k-data",
        type=Path,
        help="a local copy of the GSM8K test split (else downloaded, sha256-pinned)",
    )
    _add_out_mode_flags(run)
    run.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    _add_campaign_parsers(sub)
    _add_plan_parsers(sub)
    _add_report_parser(sub)
    from cli.eval_cmd import add_eval_parser

    add_eval_parser(sub)
    return parser


def _add_report_parser(sub: argparse._SubParsersAction) -> None:
    """`bench report DIR`: tables, plots, costs and caveats (cli/report.py writes them)."""
    report = sub.add_parser(
        "report",
        help="write report.md, report.html, cells.csv and PNG plots from results folders",
        description="Read results folders (one shard, a `bench fetch` / `bench run --out` "
        "folder above shards, or a standalone `bench sweep`/`bench probe` folder), write the "
        "seeds' tables, per-user speed under the SLO, what to run where across GPUs, plots, "
        "cost per million tokens, scope and caveats, and print the headline tables.",
    )
    report.add_argument(
        "dirs",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="results folder; several make one report over them (arms shown as arm@label)",
    )
    report.add_argument(
        "--label",
        type=lambda text: [part.strip() for part in text.split(",")],
        help="one label per folder, comma-separated, e.g. l4,t4 (default: the folder names)",
    )
    report.add_argument(
        "--baseline", help="arm that ratios are taken to (default: the first arm with a probe)"
    )
    report.add_argument("--out", type=Path, help="where to write (default: the first DIR/report)")
    report.add_argument(
        "--prices",
        choices=("auto", "aws", "table"),
        default="auto",
        help="auto: the AWS Price List API and spot price history when credentials exist, "
        "else the shipped dated table; aws: AWS only; table: never call AWS (auto)",
    )
    report.add_argument("--price-table", type=Path, help="a price table TOML (default: shipped)")
    for name, what in (("ttft", "time to first token"), ("tpot", "time per output token")):
        report.add_argument(
            f"--slo-{name}-ms",
            type=float,
            help=f"SLO on {what} p99, ms (default: the spec's slo_{name}_ms)",
        )
    report.add_argument(
        "--slo-e2el-ms", type=float, help="SLO on end-to-end latency p99, ms (default: the spec's)"
    )
    report.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    diff = sub.add_parser(
        "diff",
        help="compare two results folders cell by cell; exit 1 on a gated regression",
        description="Print every cell OLD and NEW share (one request; each shape and level) "
        "with the ratio NEW/OLD and whether it is past the run-to-run spread. With --fail-on, "
        "exit with status 1 when a shared cell's metric moved past the threshold and past the "
        "spread, so a CI job can gate an engine upgrade.",
    )
    diff.add_argument("old", type=Path, help="results folder before")
    diff.add_argument("new", type=Path, help="results folder after")
    diff.add_argument(
        "--fail-on",
        action="append",
        default=[],
        metavar="METRIC:±N%",
        help="e.g. tok_s:-5%% (fell more than 5%%) or ttft_p99_ms:+10%% (rose more than 10%%); "
        "metrics: tok_s, user_decode_p50_tok_s, ttft_p99_ms, tpot_p99_ms, itl_p99_ms, "
        "latency_p99_ms; repeatable",
    )
    diff.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _add_campaign_parsers(sub: argparse._SubParsersAction) -> None:
    """`bench launch|status|fetch|cleanup`: campaigns on AWS (cli/control.py runs them)."""
    launch = sub.add_parser(
        "launch",
        help="launch a campaign on AWS: one instance per shard, spot first, then on-demand",
        description="Validate the spec, run the pre-launch checks (stack, vCPU quotas, "
        "zones, HF-token secret, spot role, runtime backstop, engine pins on their index; "
        "any problem: nothing is "
        "launched), upload the spec to the stack's bucket and start one instance per shard: "
        "spot in every subnet whose zone offers the type, then on-demand. Relaunching is "
        "safe: shards with a running instance are left alone.",
    )
    launch.add_argument("spec", type=Path, help="campaign spec (TOML)")
    launch.add_argument(
        "--wait",
        action="store_true",
        help="wait until every shard's agent reports installing or later",
    )
    launch.add_argument(
        "--wait-timeout-min",
        type=float,
        default=30.0,
        help="--wait gives up after this many minutes (30)",
    )
    launch.add_argument(
        "--public-sources",
        action="store_true",
        help="every model source is public: an empty HF-token secret is not a problem",
    )
    launch.add_argument(
        "--no-pin-check",
        dest="pin_check",
        action="store_false",
        help="do not resolve the engine pins on the package index first",
    )
    _add_stack_flags(launch, bucket=True)

    status = sub.add_parser(
        "status",
        help="campaign status: phase, job, heartbeat, ETA per shard",
        description="Read the shards' status parameters and instance states; a running "
        "instance whose heartbeat is older than 5 minutes is shown as stale.",
    )
    status.add_argument(
        "campaign", nargs="?", help="campaign name (default: every campaign there is)"
    )
    status.add_argument(
        "--watch", action="store_true", help="refresh until every shard is done or failed"
    )
    status.add_argument(
        "--interval", type=float, default=30.0, help="--watch: seconds between refreshes (30)"
    )
    status.add_argument(
        "--watch-max-min",
        type=float,
        default=24 * 60.0,
        help="--watch: stop after this many minutes (1440)",
    )
    _add_stack_flags(status, bucket=False)

    fetch = sub.add_parser(
        "fetch",
        help="download a campaign's results (resumable) and check the tarballs",
        description="Download s3://<bucket>/results/<campaign>/ into DIR/<shard>/, skipping "
        "files already there with the same size and checksum, resuming partial downloads, "
        "and checking each shard's tarball against its manifest.",
    )
    fetch.add_argument("campaign", help="campaign name")
    fetch.add_argument(
        "dir", nargs="?", type=Path, help="destination (default: ./results/<campaign>)"
    )
    _add_stack_flags(fetch, bucket=True)

    cleanup = sub.add_parser(
        "cleanup",
        help="find this project's instances and end the ones that should have ended",
        description="List every instance tagged bench:campaign with its age and campaign; "
        "terminate those whose shard or campaign is finished or that are past their max "
        "runtime; delete the status parameters of campaigns with no instance left.",
    )
    cleanup.add_argument("--yes", action="store_true", help="do it without asking")
    cleanup.add_argument("--campaign", help="only this campaign's instances and parameters")
    _add_stack_flags(cleanup, bucket=False)


def _add_plan_parsers(sub: argparse._SubParsersAction) -> None:
    """`bench plan` (cli/plan.py) and `bench iam-policy` (cli/iam.py)."""
    plan = sub.add_parser(
        "plan",
        help="what a campaign will run, how long, what it costs, and whether it can launch",
        description="Per shard: the jobs in order with estimated hours (the seeds' measured "
        "timings as priors, each named), the instance and GPU, and dollars on demand and at "
        "the spot price now; totals in wall time and instance-hours; whether every engine "
        "pin resolves on its index. With AWS credentials also AWS prices and the pre-launch "
        "checks `bench launch` runs. Launches nothing.",
    )
    plan.add_argument("spec", type=Path, help="campaign spec (TOML)")
    plan.add_argument("--region", help="price in this region (default: the credentials')")
    plan.add_argument("--price-table", type=Path, help="a price table TOML (default: shipped)")
    plan.add_argument(
        "--offline", action="store_true", help="ask AWS nothing (priors and the price table)"
    )
    plan.add_argument(
        "--no-pin-check",
        dest="pin_check",
        action="store_false",
        help="do not resolve the engine pins on the package index",
    )
    plan.add_argument(
        "--public-sources",
        action="store_true",
        help="every model source is public: an empty HF-token secret is not a problem",
    )
    _add_stack_flags(plan, bucket=False)

    iam = sub.add_parser(
        "iam-policy",
        help="print the least-privilege IAM policy a workstation user needs (JSON)",
        description="Derive, from the deployed stack's outputs, the IAM policy that allows "
        "exactly what `bench plan|launch|status|fetch|cleanup|report` call: "
        "aws iam create-policy --policy-name bench-workstation --policy-document "
        "\"$(bench iam-policy)\"",
    )
    _add_stack_flags(iam, bucket=False)


def _add_stack_flags(parser: argparse.ArgumentParser, *, bucket: bool) -> None:
    parser.add_argument(
        "--stack",
        default=os.environ.get(STACK_ENV, STACK_NAME),
        help=f"CloudFormation stack name (${STACK_ENV}, default {STACK_NAME})",
    )
    if bucket:
        parser.add_argument(
            "--bucket",
            help="results bucket; must be the stack's (fetch: names a bucket kept after "
            "its stack was destroyed)",
        )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def _default_out(kind: str) -> Path:
    from datetime import datetime

    return Path("results") / f"{kind}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _configure_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, console=_console(stderr=True))],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


async def _probe(args: argparse.Namespace) -> int:
    from agent.loadgen.client import OpenAIClient
    from agent.loadgen.probe import PROBE_PROMPTS, run_probe
    from agent.results import ResultWriter
    from agent.telemetry.server_metrics import SERVER_METRICS_FILE, polling
    from cli.outdir import move_aside, prepare_out
    from contract.results import ProbeSummary
    from contract.suite import ProbeSettings
    from report.console import print_tables, probe_table, report_of

    try:
        settings = ProbeSettings(
            output_tokens=args.output_tokens,
            repeats=args.repeats,
            at_once=args.at_once,
            request=_request_settings(args),
        )
    except ValidationError as exc:
        raise UserError(_one_line(exc)) from exc
    out = args.out or _default_out("probe")
    mode = _out_mode(args)
    console = _console()
    if mode == "resume":
        previous = _previous(out, ProbeSummary)
        if previous.settings != settings:
            raise UserError(f"--resume: {out} was probed with other settings; use --overwrite")
        if previous.finished_unix_s is not None:
            print_tables(console, [probe_table(report_of([out]))])
            console.print(f"results: {out} (already complete; nothing to resume)")
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
            console.print(f"earlier results moved to {aside}")
        writer = ResultWriter(out)
        with (
            _progress(total, "probe") as advance,
            polling(client.base_url, out / SERVER_METRICS_FILE, "probe"),
        ):
            summary = await run_probe(client, settings, writer, progress=advance)
    _standalone(out, "probe", summary.base_url, [summary.model], settings)
    print_tables(console, [probe_table(report_of([out]))])
    console.print(f"results: {out}")
    return 0 if summary.requests_failed == 0 else 1


def _previous(out: Path, kind: type[_S]) -> _S:
    """The summary an earlier run left in `out`, for --resume; one line if there is none."""
    from contract.results import SUMMARY_FILE

    path = out / SUMMARY_FILE
    if not path.exists():
        raise UserError(f"--resume: {out} holds no results to resume")
    try:
        return kind.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise UserError(f"--resume: cannot read {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise UserError(
            f"--resume: {path} is not a {kind.__name__} ({_one_line(exc)}); use --overwrite"
        ) from exc


def _parse_shapes(text: str) -> tuple[Shape, ...]:
    from contract.suite import Shape

    try:
        shapes = tuple(Shape.parse(s) for s in text.split(",") if s.strip())
    except ValueError as exc:
        raise UserError(f"--shapes: {_one_line(exc)}") from exc
    if not shapes:
        raise UserError("--shapes: give at least one INPUT/OUTPUT shape, e.g. 512/128")
    return shapes


async def _sweep(args: argparse.Namespace) -> int:
    from agent.loadgen.arrivals import connections_for
    from agent.loadgen.client import OpenAIClient
    from agent.loadgen.sweep import count_requests, run_sweep
    from agent.loadgen.text_sources import load_source
    from agent.results import ResultWriter
    from agent.telemetry.server_metrics import SERVER_METRICS_FILE, polling
    from cli.outdir import prepare_out
    from contract.results import REQUESTS_FILE, VLLM_EXPORT_FILE, SweepSummary
    from contract.suite import SweepSettings
    from report.console import print_tables, report_of, sweep_tables

    if (args.mode == "rate") != bool(args.rates):
        raise UserError("--rates goes with --mode rate, and --mode rate needs --rates")
    try:
        settings = SweepSettings(
            shapes=_parse_shapes(args.shapes),
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
            request=_request_settings(args),
        )
    except ValidationError as exc:
        raise UserError(_one_line(exc)) from exc
    source = load_source(settings.prompts, gsm8k_data=args.gsm8k_data)
    out = args.out or _default_out("sweep")
    mode = _out_mode(args)
    previous = _previous(out, SweepSummary) if mode == "resume" else None
    if previous is not None and previous.settings != settings:
        raise UserError(f"--resume: {out} was swept with other settings; use --overwrite")
    console = _console()
    async with OpenAIClient(
        args.url,
        model=args.model,
        settings=settings.request,
        transport=args.transport,
        max_connections=connections_for(settings),
    ) as client:
        info = await client.server_info()  # unreachable: one line, and no folder left behind
        if previous is not None and (previous.base_url, previous.model) != (
            client.base_url,
            info.model,
        ):
            raise UserError(
                f"--resume: {out} measured {previous.model} at {previous.base_url}, "
                f"not {info.model} at {client.base_url}"
            )
        aside = prepare_out(out, mode)
        if aside:
            console.print(f"earlier results moved to {aside}")
        writer = ResultWriter(out)
        if previous is not None:
            done = {(c.shape, c.concurrency) for c in previous.cells}
            moved = writer.set_aside(REQUESTS_FILE, lambda row: _in_cells(row, done))
            moved += writer.set_aside(VLLM_EXPORT_FILE, lambda row: _in_cells(row, done))
            if moved:
                console.print(f"set aside {moved} line(s) of the cell that was interrupted")
        total = count_requests(settings) if settings.mode == "burst" else None
        with (
            _progress(total, "sweep") as advance,
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
    _standalone(out, "sweep", summary.base_url, [summary.model], settings)
    if settings.mode == "rate":
        from cli.rate_table import rate_table

        console.print(rate_table(summary))
    else:
        print_tables(console, sweep_tables(report_of([out])))
    console.print(f"results: {out}")
    lost = summary.counts["failed"] + summary.counts.get("partial", 0)
    return 0 if lost == 0 else 1


def _in_cells(row: dict[str, object], done: set[tuple[str, int]]) -> bool:
    """Whether a requests.jsonl / vllm export line belongs to a finished cell."""
    label = str(row.get("label", ""))
    if label == "calibration":
        return True
    if label.startswith("bench:"):  # vllm export: one line per measured window
        return (label[len("bench:") :], row.get("max_concurrency")) in done
    shape, _, rest = label.partition("/c")
    level = rest.split("/", 1)[0]
    return level.isdigit() and (shape, int(level)) in done


def _standalone(out: Path, kind: str, base_url: str, models: list[str], settings) -> None:
    """standalone.json beside the summary, so `bench report` can read the folder."""
    from agent.standalone import write_standalone_manifest

    write_standalone_manifest(
        out,
        kind=kind,  # type: ignore[arg-type]
        base_url=base_url,
        models=models,
        settings=settings.model_dump(mode="json"),
    )


def _progress(total: int | None, description: str):
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=_console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task(description, total=total)
            yield lambda n: progress.advance(task, n)

    return bar()


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    try:
        if args.command == "probe":
            return asyncio.run(_probe(args))
        if args.command == "sweep":
            return asyncio.run(_sweep(args))
        if args.command == "eval":
            from cli.eval_cmd import run_eval_command

            return run_eval_command(args)
        if args.command == "run":
            from cli.local_run import run_local

            return run_local(args.spec, args.out, args.gsm8k_data, mode=_out_mode(args))
        if args.command == "report":
            from cli.report import run_report

            return run_report(args)
        if args.command == "diff":
            from cli.report import run_diff

            return run_diff(args)
        if args.command == "plan":
            from cli.plan import run_plan

            return run_plan(args)
        if args.command in CAMPAIGN_COMMANDS:
            from cli.control import run_control

            return run_control(args)
    except BenchError as exc:
        print(f"bench {args.command}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"bench {args.command}: interrupted; results written so far are kept", file=sys.stderr
        )
        return 130
    except Exception:
        traceback.print_exc()
        print(
            f"bench {args.command}: this is a bug in bench, not a problem with your input; "
            "the traceback above says where",
            file=sys.stderr,
        )
        return 1
    return 2


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}"
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
