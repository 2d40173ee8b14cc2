"""`bench eval gsm8k|bfcl URL`: ask a running server GSM8K or BFCL, as a campaign would.

Writes `answers.jsonl`, `summary.json` and a standalone manifest into `--out`, shows a
progress bar with the running accuracy, and prints the accuracy table (GSM8K's strict-match
and flexible-extract, BFCL's official AST checker).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used, so `bench --help` stays instant
    from rich.console import Console
    from rich.table import Table

    from agent.evals.task import EvalTask
    from contract.evals import BFCLSettings, EvalSummary, GSM8KSettings

__all__ = ["add_eval_parser", "eval_table", "run_eval_command"]

log = logging.getLogger(__name__)


def add_eval_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "eval",
        help="ask a running server GSM8K or BFCL and score the answers",
        description="Every question asked once (greedy, thinking off), scored as it comes: "
        "GSM8K with lm-evaluation-harness's strict-match and flexible-extract, BFCL simple "
        "(Python) with bfcl-eval's own AST checker. answers.jsonl and summary.json go to --out.",
    )
    parser.add_argument("eval", choices=("gsm8k", "bfcl"), help="which eval")
    parser.add_argument(
        "url", help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--model", help="model id to request (default: the first in /v1/models)")
    parser.add_argument(
        "--data",
        type=Path,
        help="gsm8k: a local copy of the test split (default: downloaded, sha256-pinned); a "
        "file that is not the pinned split is used as given and its sha256 recorded",
    )
    parser.add_argument("--limit", type=int, help="ask only the first N questions")
    parser.add_argument(
        "--concurrency", type=int, default=1, help="questions in flight at once (1)"
    )
    parser.add_argument(
        "--prompt",
        choices=("zero-shot", "gsm8k", "gsm8k_cot"),
        default="zero-shot",
        help="gsm8k: zero-shot chat with the '#### N' instruction, lm-eval's gsm8k (5-shot; "
        "needs --train-data) or gsm8k_cot (8 fixed exemplars) (zero-shot)",
    )
    parser.add_argument("--train-data", type=Path, help="gsm8k --prompt gsm8k: the train split")
    parser.add_argument(
        "--mode",
        choices=("tools", "prompt"),
        default="tools",
        help="bfcl: native OpenAI tools or BFCL's prompt format (tools)",
    )
    parser.add_argument("--max-tokens", type=int, help="answer cap (gsm8k 2048, bfcl 512)")
    parser.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="gsm8k: /v1/chat/completions or /v1/completions (chat)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout (s)")
    parser.add_argument("--out", type=Path, help="results folder (default: ./results/eval-<time>)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="move what --out holds aside (to <out>.replaced-<time>) and start again",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


_GSM8K_PROMPTS = {
    "zero-shot": "zero-shot",
    "gsm8k": "lm-eval-5shot",
    "gsm8k_cot": "lm-eval-cot-8shot",
}


def _settings(args: argparse.Namespace) -> GSM8KSettings | BFCLSettings:
    from contract.evals import BFCLSettings, GSM8KSettings
    from contract.suite import RequestSettings

    request = RequestSettings(endpoint=args.endpoint, force_output="none", timeout_s=args.timeout_s)
    common: dict[str, object] = {
        "limit": args.limit,
        "concurrency": args.concurrency,
        "request": request,
    }
    if args.max_tokens is not None:
        common["max_tokens"] = args.max_tokens
    if args.eval == "gsm8k":
        return GSM8KSettings(prompt=_GSM8K_PROMPTS[args.prompt], **common)  # type: ignore[arg-type]
    return BFCLSettings(mode=args.mode, **common)  # type: ignore[arg-type]


def eval_table(summary: EvalSummary) -> Table:
    """Accuracy by every mark the eval has (headline first), with what was lost."""
    from rich.table import Table

    table = Table(title=f"{summary.eval} ({summary.prompt}), {summary.model}")
    for column in ("mark", "correct", "answered", "accuracy", "truncated", "failed"):
        table.add_column(column, justify="left" if column == "mark" else "right")
    marks = sorted(summary.marks, key=lambda m: m != summary.headline)
    for mark in marks:
        count = summary.marks[mark]
        table.add_row(
            mark + (" (headline)" if mark == summary.headline else ""),
            str(count.correct),
            str(count.n),
            "-" if count.score is None else f"{count.score:.1%}",
            str(summary.truncated),
            str(summary.failed),
        )
    return table


async def _run(args: argparse.Namespace, console: Console) -> EvalSummary:
    from agent.evals.gsm8k import GSM8K_TEST_SHA256
    from agent.evals.runner import load_task
    from agent.loadgen.client import OpenAIClient
    from agent.standalone import write_standalone_manifest
    from agent.telemetry.server_metrics import SERVER_METRICS_FILE
    from cli.outdir import nothing_left_unless_measured, prepare_out

    settings = _settings(args)
    # A local copy is used as given; its sha256 is recorded, and a warning says when it is
    # not the pinned split (its scores then compare with nothing published).
    task = load_task(settings, data_path=args.data, data_sha256=None, train_path=args.train_data)
    if args.data and task.data_sha256 != GSM8K_TEST_SHA256 and args.eval == "gsm8k":
        log.warning("%s is not the pinned GSM8K test split (sha256 differs)", args.data)
    out = args.out or _default_out()
    async with OpenAIClient(args.url, model=args.model, settings=settings.request) as client:
        model = (await client.server_info()).model  # unreachable: one line, no folder
    aside = prepare_out(out, "overwrite" if args.overwrite else "new", resumable=False)
    if aside:
        console.print(f"earlier results moved to {aside}")
    with nothing_left_unless_measured(
        out, aside, say=console.print, unmeasured=(SERVER_METRICS_FILE,)
    ):
        summary = await _ask(task, args, out, model)
    write_standalone_manifest(
        out,
        kind="eval",
        base_url=summary.base_url,
        models=[summary.model],
        settings=settings.model_dump(mode="json"),
    )
    console.print(eval_table(summary))
    console.print(f"results: {out}")
    return summary


async def _ask(task: EvalTask[Any], args: argparse.Namespace, out: Path, model: str) -> EvalSummary:
    """Every question of `task` asked into `out`, with a progress bar of the accuracy."""
    from agent.evals.runner import run_eval
    from agent.loadgen.client import normalise_base_url
    from agent.telemetry.server_metrics import SERVER_METRICS_FILE, polling
    from cli.standalone import progress_bar
    from contract.evals import AnswerRecord

    seen = {"answered": 0, "correct": 0}
    with progress_bar(len(task.questions()), args.eval) as bar:

        def advance(record: AnswerRecord) -> None:
            seen["answered"] += 1
            seen["correct"] += int(record.correct)
            accuracy = seen["correct"] / seen["answered"]
            bar(1, description=f"{args.eval} accuracy {accuracy:.1%}")

        with polling(normalise_base_url(args.url), out / SERVER_METRICS_FILE, args.eval):
            return await run_eval(task, args.url, out, model=model, progress=advance)


def _default_out() -> Path:
    from datetime import datetime

    return Path("results") / f"eval-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_eval_command(args: argparse.Namespace) -> int:
    """Exit status 0 when every question was answered without a failed request, else 1."""
    from rich.console import Console

    summary = asyncio.run(_run(args, Console()))
    return 0 if summary.failed == 0 else 1
