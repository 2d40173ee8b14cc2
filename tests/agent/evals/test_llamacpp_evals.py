"""The evals end to end against a real engine: llama.cpp's server on the tiny random model.

Its answers are junk, and that is fine: what is checked is that every question was asked,
answered, scored and written, with a reason for every verdict.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from agent.evals.runner import load_task, run_eval
from contract.evals import ANSWERS_FILE, AnswerRecord, BFCLSettings, EvalSummary, GSM8KSettings
from contract.results import SUMMARY_FILE
from contract.suite import RequestSettings
from engines.recipes import get_recipe
from tests.agent.evals.conftest import GSM8K_FIXTURE, GSM8K_FIXTURE_SHA256

pytestmark = pytest.mark.slow

# Small caps keep the junk short: the test slots hold 2,048 tokens, prompt included.
REQUEST = RequestSettings(
    force_output="none", extra_body=dict(get_recipe("llamacpp").request_extras), timeout_s=120
)


def _written(job: Path) -> tuple[list[AnswerRecord], EvalSummary]:
    answers = [
        AnswerRecord.model_validate(orjson.loads(line))
        for line in (job / ANSWERS_FILE).read_bytes().splitlines()
    ]
    summary = EvalSummary.model_validate(orjson.loads((job / SUMMARY_FILE).read_bytes()))
    return answers, summary


def _every_question_recorded(answers: list[AnswerRecord], summary: EvalSummary, ids: list[str]):
    assert [a.question_id for a in answers] == ids
    assert summary.complete and summary.answered == summary.questions == len(ids)
    assert summary.correct == sum(a.correct for a in answers)
    for answer in answers:
        assert answer.reason
        assert set(answer.marks) == set(summary.marks)
        if answer.error is None:
            assert answer.latency_s is not None and answer.latency_s > 0
            assert answer.completion_tokens is not None and answer.completion_tokens > 0


def test_gsm8k_on_llamacpp(llama_server_url: str, tmp_path: Path):
    settings = GSM8KSettings(max_tokens=128, request=REQUEST)
    task = load_task(settings, data_path=GSM8K_FIXTURE, data_sha256=GSM8K_FIXTURE_SHA256)
    summary = asyncio.run(run_eval(task, llama_server_url, tmp_path / "gsm8k"))
    answers, written = _written(tmp_path / "gsm8k")
    assert written == summary
    _every_question_recorded(answers, summary, [f"gsm8k-{i}" for i in range(6)])
    assert summary.failed == 0, summary.errors
    assert all(a.gsm8k is not None for a in answers)
    assert all(a.completion_tokens <= 128 for a in answers if a.completion_tokens)
    assert summary.truncated == sum(a.truncated for a in answers)


@pytest.mark.parametrize("mode", ["tools", "prompt"])
def test_bfcl_on_llamacpp(llama_server_url: str, tmp_path: Path, mode: str):
    settings = BFCLSettings(mode=mode, max_tokens=64, limit=4, request=REQUEST)  # type: ignore[arg-type]
    summary = asyncio.run(run_eval(load_task(settings), llama_server_url, tmp_path / mode))
    answers, _ = _written(tmp_path / mode)
    _every_question_recorded(answers, summary, [f"simple_python_{i}" for i in range(4)])
    assert summary.prompt == mode
    for answer in answers:
        # Served, or refused with the server's reason: either way scored and kept.
        assert answer.bfcl is not None or answer.error is not None
