"""`bench`: the one console script. Parses flags (cli/parser.py), runs the command's module,
and turns expected failures into one line.

Imports of heavy parts happen inside each command so `bench --help` stays instant.
Expected failures (contract.errors.BenchError) are printed as one line on stderr with exit
status 2; anything else is a bug and shows its traceback, saying so.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import traceback
from collections.abc import Sequence

from cli.parser import CAMPAIGN_COMMANDS, build_parser, out_mode
from cli.standalone import console, one_line
from contract.errors import BenchError

__all__ = ["main"]


def _configure_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(show_path=False, console=console(stderr=True))],
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    try:
        if args.command == "probe":
            from cli.probe_cmd import run_probe_command

            return asyncio.run(run_probe_command(args))
        if args.command == "sweep":
            from cli.sweep_cmd import run_sweep_command

            return asyncio.run(run_sweep_command(args))
        if args.command == "eval":
            from cli.eval_cmd import run_eval_command

            return run_eval_command(args)
        if args.command == "run":
            from cli.local_run import run_local

            return run_local(args.spec, args.out, args.gsm8k_data, mode=out_mode(args))
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
        print(f"bench {args.command}: {one_line(exc)}", file=sys.stderr)
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


if __name__ == "__main__":
    raise SystemExit(main())
