"""What `bench probe` and `bench sweep` against a running server share: request flags made
into settings, the earlier summary in `--out` for `--resume`, asking the server before
`--out` is touched, the standalone manifest that lets `bench report` read the folder, the
progress bar, and one-line user errors.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

from contract.errors import BenchError

if TYPE_CHECKING:
    from rich.console import Console

    from agent.loadgen.client import OpenAIClient
    from cli.outdir import OutMode
    from contract.results import ProbeSummary, SweepSummary
    from contract.standalone import StandaloneKind
    from contract.suite import RequestSettings

__all__ = [
    "UserError",
    "console",
    "default_out",
    "one_line",
    "open_out",
    "previous_summary",
    "progress_bar",
    "request_settings",
    "write_standalone",
]

_S = TypeVar("_S", bound=BaseModel)


class UserError(BenchError):
    """A problem with what the user asked for: printed as one line, exit status 2."""


def one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        return f"{where}: {first['msg']}"
    return " ".join(str(exc).split()) or type(exc).__name__


def request_settings(args: argparse.Namespace) -> RequestSettings:
    from contract.suite import RequestSettings

    return RequestSettings(
        endpoint=args.endpoint,
        force_output=args.force_output,
        thinking=args.thinking,
        timeout_s=args.timeout_s,
        extra_body=args.extra_body,
    )


def default_out(kind: str) -> Path:
    from datetime import datetime

    return Path("results") / f"{kind}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr)


def previous_summary(out: Path, kind: type[_S]) -> _S:
    """The summary an earlier run left in `out`, for --resume; one line if there is none."""
    from contract.results import REQUESTS_FILE, SUMMARY_FILE

    path = out / SUMMARY_FILE
    if not path.exists() and (out / REQUESTS_FILE).exists():
        raise UserError(
            f"--resume: {out} holds requests but no summary (stopped before it wrote one); "
            "use --overwrite to move it aside and start again"
        )
    if not path.exists():
        raise UserError(f"--resume: {out} holds no results to resume")
    try:
        return kind.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise UserError(f"--resume: cannot read {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise UserError(
            f"--resume: {path} is not a {kind.__name__} ({one_line(exc)}); use --overwrite"
        ) from exc


def write_standalone(
    out: Path, kind: StandaloneKind, base_url: str, models: list[str], settings: BaseModel
) -> None:
    """standalone.json beside the summary, so `bench report` can read the folder."""
    from agent.standalone import write_standalone_manifest

    write_standalone_manifest(
        out,
        kind=kind,
        base_url=base_url,
        models=models,
        settings=settings.model_dump(mode="json"),
    )


def progress_bar(total: int | None, description: str):
    """A transient bar on stderr; yields `advance(n, description=None)` (a new description
    replaces the bar's label, e.g. with a running accuracy)."""
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console(stderr=True),
            transient=True,
        ) as progress:
            task = progress.add_task(description, total=total)
            yield lambda n, description=None: progress.update(
                task, advance=n, description=description
            )

    return bar()


async def open_out(
    client: OpenAIClient,
    out: Path,
    mode: OutMode,
    previous: ProbeSummary | SweepSummary | None,
    screen: Console,
) -> Path | None:
    """Ask the server what it serves (unreachable: one line, and no folder made), check a
    resumed run measured the same, then make `out` ready for `mode`; returns where an
    overwritten folder went.
    """
    from cli.outdir import prepare_out

    info = await client.server_info()
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
        screen.print(f"earlier results moved to {aside}")
    return aside
