"""`bench eval` end to end: a server that replays known answers (exact scores), llama.cpp,
and the batch-invariant PyTorch engine (the same verdicts at 8 in flight as at 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent.evals.bfcl import load_bfcl
from agent.evals.gsm8k import load_gsm8k
from agent.supervisor import EngineServer, free_port
from contract.evals import ANSWERS_FILE, AnswerRecord, EvalSummary
from contract.results import SUMMARY_FILE
from contract.standalone import STANDALONE_FILE, StandaloneManifest
from tests.agent.evals.conftest import (
    GSM8K_FIXTURE,
    Response,
    chat_response,
    scripted_server,
    user_text,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)},
    )


def read(out: Path) -> tuple[EvalSummary, list[AnswerRecord]]:
    summary = EvalSummary.model_validate_json((out / SUMMARY_FILE).read_bytes())
    answers = [
        AnswerRecord.model_validate(orjson.loads(line))
        for line in (out / ANSWERS_FILE).read_bytes().splitlines()
    ]
    return summary, answers


def test_gsm8k_against_a_replay_server_scores_exactly(tmp_path: Path):
    items = load_gsm8k(GSM8K_FIXTURE, sha256=None)
    # Question i gets: right in both filters (0, 3), right only for flexible-extract (1, 4),
    # wrong in both (2, 5). Expected: flexible 4 of 6, strict 2 of 6.
    replies = {
        0: lambda t: f"Adding up.\n#### {t}",
        1: lambda t: f"So the total is {t}.",
        2: lambda t: "#### 1234567",
    }

    def respond(body: dict[str, Any]) -> Response:
        text = user_text(body)
        item = next(i for i in items if i.question in text)
        return chat_response(replies[item.index % 3](item.target))

    out = tmp_path / "gsm8k"
    with scripted_server(respond) as server:
        done = bench(
            "eval", "gsm8k", server.url, "--data", str(GSM8K_FIXTURE), "--concurrency", "4",
            "--out", str(out),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary, answers = read(out)
    assert (summary.answered, summary.correct) == (6, 4)
    assert summary.marks["flexible-extract"].correct == 4
    assert summary.marks["strict-match"].correct == 2
    assert summary.settings.concurrency == 4 and summary.complete
    assert sorted(a.index for a in answers) == list(range(6))
    assert "flexible-extract (headline)" in done.stdout and "66.7%" in done.stdout
    manifest = StandaloneManifest.model_validate_json((out / STANDALONE_FILE).read_bytes())
    assert (manifest.kind, manifest.models, manifest.base_url) == ("eval", ["scripted"], server.url)
    assert manifest.settings["concurrency"] == 4


def test_bfcl_against_a_replay_server_scores_exactly(tmp_path: Path):
    items = load_bfcl()[:3]

    def respond(body: dict[str, Any]) -> Response:
        name = body["tools"][0]["function"]["name"]
        if user_text(body) == items[0].messages[0]["content"]:
            return chat_response(
                None, tool_calls=[{"name": name, "arguments": '{"base": 10, "height": 5}'}]
            )
        return chat_response("no call")

    out = tmp_path / "bfcl"
    with scripted_server(respond) as server:
        done = bench("eval", "bfcl", server.url, "--limit", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary, _ = read(out)
    assert (summary.answered, summary.correct, summary.marks["ast"].correct) == (3, 1, 1)
    assert "ast (headline)" in done.stdout


def test_bench_eval_bad_input_is_one_line(tmp_path: Path):
    done = bench("eval", "gsm8k", "http://127.0.0.1:9", "--data", str(tmp_path / "none.jsonl"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("bench eval: GSM8K data") and "does not exist" in line


def test_bench_eval_against_an_unreachable_server_is_one_line_and_leaves_no_folder(
    tmp_path: Path,
):
    out = tmp_path / "never"
    done = bench("eval", "bfcl", f"http://127.0.0.1:{free_port()}", "--out", str(out))
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("bench eval: cannot reach http://127.0.0.1:")
    assert not out.exists()


def test_bench_eval_refuses_a_used_out_and_overwrite_moves_it_aside(tmp_path: Path):
    out = tmp_path / "bfcl"
    with scripted_server(lambda body: chat_response("no call")) as server:
        args = ["eval", "bfcl", server.url, "--limit", "2", "--out", str(out)]
        assert bench(*args).returncode == 0
        before = (out / ANSWERS_FILE).read_bytes()
        again = bench(*args)
        assert again.returncode == 2
        (line,) = again.stderr.strip().splitlines()
        assert "already holds results" in line and "--overwrite" in line
        assert "--resume" not in line
        assert (out / ANSWERS_FILE).read_bytes() == before, "the earlier answers are untouched"
        nope = bench(*args, "--model", "nope", "--overwrite")
        assert nope.returncode == 2 and "'nope' is not served" in nope.stderr
        assert (out / ANSWERS_FILE).read_bytes() == before
        overwritten = bench(*args, "--overwrite")
    assert overwritten.returncode == 0, overwritten.stderr
    (aside,) = tmp_path.glob("bfcl.replaced-*")
    assert (aside / ANSWERS_FILE).read_bytes() == before
    assert read(out)[0].answered == 2


@pytest.mark.slow
def test_gsm8k_against_llamacpp_end_to_end(llama_server_url: str, tmp_path: Path):
    out = tmp_path / "llama"
    done = bench(
        "eval", "gsm8k", llama_server_url, "--data", str(GSM8K_FIXTURE), "--limit", "3",
        "--max-tokens", "32", "--concurrency", "2", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary, answers = read(out)
    assert summary.answered == 3 and summary.complete and summary.failed == 0
    assert all(a.completion_tokens for a in answers)


@pytest.mark.slow
def test_concurrency_8_gives_the_verdicts_of_1_on_the_batch_invariant_engine(tmp_path: Path):
    port = free_port()
    argv = [sys.executable, "-m", "engines.pytorch", "--model", "random:tiny", "--port", str(port)]
    argv += ["--max-running", "16", "--dtype", "auto"]
    url = f"http://127.0.0.1:{port}"
    with EngineServer(
        "pytorch",
        argv,
        log_path=tmp_path / "server.log",
        port=port,
        env={"PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    ) as server:
        server.wait_healthy(f"{url}/health", 90.0)
        runs = {}
        for concurrency in ("1", "8"):
            out = tmp_path / f"c{concurrency}"
            done = bench(
                "eval", "gsm8k", url, "--data", str(GSM8K_FIXTURE), "--max-tokens", "24",
                "--concurrency", concurrency, "--out", str(out),
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            runs[concurrency] = read(out)
    (one, answers_1), (eight, answers_8) = runs["1"], runs["8"]
    assert eight.settings.concurrency == 8 and one.settings.concurrency == 1
    by_index_1 = {a.index: (a.reply, a.correct, a.extracted) for a in answers_1}
    by_index_8 = {a.index: (a.reply, a.correct, a.extracted) for a in answers_8}
    assert by_index_1 == by_index_8 and len(by_index_1) == 6


def test_the_spec_takes_eval_concurrency() -> None:
    from contract.spec import SpecError, parse_campaign

    base = (REPO_ROOT / "agent" / "campaigns" / "local.toml").read_text()
    spec = parse_campaign(base.replace("[suite.bfcl]\n", "[suite.bfcl]\nconcurrency = 8\n"))
    assert spec.suite.bfcl is not None and spec.suite.bfcl.concurrency == 8
    with pytest.raises(SpecError, match="concurrency"):
        parse_campaign(base.replace("[suite.bfcl]\n", "[suite.bfcl]\nconcurrency = 0\n"))
