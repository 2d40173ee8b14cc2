"""The eval runner against a scripted server: what is sent, and what every kind of reply becomes.

Failed requests, empty, cut-off and unreadable replies must all land in answers.jsonl as
wrong answers with a reason; the run goes on to the last question and summary.json counts
them.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent.evals.bfcl import BFCLTask, load_bfcl
from agent.evals.gsm8k import GSM8KTask, load_gsm8k
from agent.evals.runner import load_task, run_eval
from contract.evals import (
    ANSWERS_FILE,
    AnswerRecord,
    BFCLSettings,
    EvalSummary,
    GSM8KSettings,
)
from contract.results import SUMMARY_FILE
from contract.suite import RequestSettings
from tests.agent.evals.conftest import (
    GSM8K_FIXTURE,
    GSM8K_FIXTURE_SHA256,
    Response,
    chat_response,
    scripted_server,
    user_text,
)


def read_answers(job: Path) -> list[AnswerRecord]:
    return [
        AnswerRecord.model_validate(orjson.loads(line))
        for line in (job / ANSWERS_FILE).read_bytes().splitlines()
    ]


def read_summary(job: Path) -> EvalSummary:
    return EvalSummary.model_validate(orjson.loads((job / SUMMARY_FILE).read_bytes()))


def gsm8k_task(**settings: Any) -> GSM8KTask:
    task = load_task(
        GSM8KSettings(**settings), data_path=GSM8K_FIXTURE, data_sha256=GSM8K_FIXTURE_SHA256
    )
    assert isinstance(task, GSM8KTask)
    return task


def test_gsm8k_run_records_every_kind_of_reply(tmp_path: Path):
    items = load_gsm8k(GSM8K_FIXTURE, sha256=GSM8K_FIXTURE_SHA256)

    def respond(body: dict[str, Any]) -> Response:
        text = user_text(body)
        index = next(i.index for i in items if i.question in text)
        if index == 0:
            return chat_response(items[0].answer)  # the reference solution
        if index == 1:
            return chat_response("Four bikes and helmets cost $1,380.")  # no '####'
        if index == 2:
            return chat_response(None)  # no content at all
        if index == 3:  # cut off at the cap, mid-reasoning
            return chat_response(
                "Half leaks, so 1 liter is left. Then",
                finish_reason="length",
                completion_tokens=2048,
            )
        if index == 4:
            return 500, b'{"error": {"message": "engine fell over"}}', "application/json"
        return 200, b"<html>not json</html>", "text/html"

    summaries: list[int] = []
    job = tmp_path / "gsm8k"
    with scripted_server(respond) as server:
        summary = asyncio.run(
            run_eval(
                gsm8k_task(),
                server.url + "/v1",
                job,
                progress=lambda record: summaries.append(read_summary(job).answered),
            )
        )

    # Asked one at a time, greedy, thinking off, with the eval's cap, to the served model.
    assert len(server.requests) == 6 and set(server.paths) == {"/v1/chat/completions"}
    for body in server.requests:
        assert body["model"] == "scripted" and body["stream"] is False
        assert body["temperature"] == 0.0 and body["max_tokens"] == 2048
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert "tools" not in body and "stop" not in body and "ignore_eos" not in body

    answers = read_answers(job)
    assert [a.question_id for a in answers] == [f"gsm8k-{i}" for i in range(6)]
    right, flexible_only, empty, cut, failed, garbage = answers
    assert right.correct and right.marks == {"flexible-extract": True, "strict-match": True}
    assert right.extracted == "12" and right.latency_s is not None and right.latency_s > 0
    assert right.completion_tokens == 10 and right.prompt_tokens == 20 and not right.truncated
    assert flexible_only.correct and flexible_only.marks["strict-match"] is False
    assert not empty.correct and empty.reply == "" and "empty reply" in empty.reason
    assert cut.truncated and not cut.correct and cut.finish_reason == "length"
    assert cut.reason.endswith("(cut off at the 2048-token cap)") and "1 != 0.75" in cut.reason
    assert not failed.correct and failed.http_status == 500
    assert failed.error is not None and failed.error.startswith("HTTP 500: ")
    assert failed.reason.startswith("request failed: HTTP 500")
    assert not garbage.correct and garbage.error is not None and "bad response" in garbage.error
    assert all(a.gsm8k is not None for a in answers[:4])

    # summary.json was rewritten after every answer, and says it all at the end.
    assert summaries == [1, 2, 3, 4, 5, 6]
    assert read_summary(job) == summary
    assert summary.complete and summary.questions == summary.answered == 6
    assert summary.correct == 2 and summary.score == pytest.approx(2 / 6)
    assert summary.marks["flexible-extract"].correct == 2
    assert summary.marks["strict-match"].correct == 1
    assert (summary.truncated, summary.failed) == (1, 2)
    assert summary.headline == "flexible-extract" and summary.prompt == "zero-shot"
    assert summary.data_sha256 == GSM8K_FIXTURE_SHA256
    assert summary.model == "scripted" and summary.wall_s > 0
    assert len(summary.errors) == 2


def test_fewshot_over_completions_sends_lm_evals_stop_sequences(tmp_path: Path):
    task = gsm8k_task(
        prompt="lm-eval-cot-8shot",
        max_tokens=256,
        limit=2,
        request=RequestSettings(force_output="none", endpoint="completions"),
    )

    def respond(body: dict[str, Any]) -> Response:
        reply = {
            "choices": [{"index": 0, "text": " So 12. The answer is 12.", "finish_reason": "stop"}]
        }
        return 200, json.dumps(reply).encode(), "application/json"

    with scripted_server(respond) as server:
        summary = asyncio.run(run_eval(task, server.url, tmp_path / "cot", model="named"))
    assert set(server.paths) == {"/v1/completions"}
    body = server.requests[0]
    assert body["model"] == "named" and body["max_tokens"] == 256
    assert body["stop"] == ["Q:", "</s>", "<|im_end|>"] and body["prompt"].endswith("\nA:")
    assert "chat_template_kwargs" not in body and "messages" not in body
    first, second = read_answers(tmp_path / "cot")
    assert first.marks == {"flexible-extract": True, "strict-match": True}
    assert first.completion_tokens is None  # no usage sent: recorded as unknown
    assert not second.correct
    assert summary.answered == 2


def test_bfcl_native_run_scores_each_call_through_the_checker(tmp_path: Path):
    items = load_bfcl()[:5]
    task = BFCLTask(BFCLSettings(), items)

    def respond(body: dict[str, Any]) -> Response:
        text = user_text(body)
        index = next(i.index for i in items if i.messages[0]["content"] == text)
        name = body["tools"][0]["function"]["name"]
        if index == 0:
            return chat_response(
                None, tool_calls=[{"name": name, "arguments": '{"base": 10, "height": 5}'}]
            )
        if index == 1:
            return chat_response(None, tool_calls=[{"name": "launch_rocket", "arguments": "{}"}])
        if index == 2:
            return chat_response(None, tool_calls=[{"name": name, "arguments": "x=3, y=4"}])
        if index == 3:
            return chat_response(
                None,
                tool_calls=[{"name": name, "arguments": '{"x": 3, "y'}],
                finish_reason="length",
                completion_tokens=512,
            )
        return chat_response("I'd rather not call anything.")

    with scripted_server(respond) as server:
        summary = asyncio.run(run_eval(task, server.url, tmp_path / "bfcl"))
    for body in server.requests:
        assert body["max_tokens"] == 512 and body["tools"][0]["type"] == "function"
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
    right, unknown, not_json, cut, no_call = read_answers(tmp_path / "bfcl")
    assert right.correct and right.bfcl is not None
    assert right.bfcl.decoded == [{"calculate_triangle_area": {"base": 10, "height": 5}}]
    assert right.tool_calls[0].name == "calculate_triangle_area"
    assert not unknown.correct and unknown.reason.startswith(
        "simple_function_checker:wrong_func_name"
    )
    assert not not_json.correct and not_json.reason.startswith("ast_decoder:decoder_failed")
    assert (
        not cut.correct and cut.truncated and cut.reason.endswith("(cut off at the 512-token cap)")
    )
    assert not no_call.correct and "no tool call" in no_call.reason
    assert no_call.reply == "I'd rather not call anything."
    assert summary.correct == 1 and summary.truncated == 1 and summary.failed == 0
    assert summary.headline == "ast" and summary.prompt == "tools"
    assert read_summary(tmp_path / "bfcl") == summary  # BFCL settings read back as BFCL's
    assert summary.checker.startswith("bfcl-eval 2026.3.23 ast_checker")


def test_bfcl_prompt_mode_reads_the_text_reply(tmp_path: Path):
    items = load_bfcl()[:2]
    task = BFCLTask(BFCLSettings(mode="prompt"), items)

    def respond(body: dict[str, Any]) -> Response:
        assert "tools" not in body and body["messages"][0]["role"] == "system"
        if items[0].messages[0]["content"] == user_text(body):
            return chat_response("[calculate_triangle_area(base=10, height=5, unit='units')]")
        return chat_response("```python\nmath.factorial(5\n```")

    with scripted_server(respond) as server:
        summary = asyncio.run(run_eval(task, server.url, tmp_path / "bfcl-prompt"))
    right, broken = read_answers(tmp_path / "bfcl-prompt")
    assert right.correct and not broken.correct
    assert broken.bfcl is not None and broken.bfcl.error_type == "ast_decoder:decoder_failed"
    assert summary.prompt == "prompt" and summary.correct == 1


def test_an_unreachable_server_is_one_clear_error(tmp_path: Path):
    with pytest.raises(ConnectionError, match="cannot ask"):
        asyncio.run(run_eval(gsm8k_task(limit=1), "http://127.0.0.1:9", tmp_path / "x"))


def test_a_server_that_goes_away_mid_run_leaves_failed_answers_not_a_crash(tmp_path: Path):
    task = gsm8k_task(limit=3, request=RequestSettings(force_output="none", timeout_s=5))
    with scripted_server(lambda body: chat_response("#### 12")) as server:
        url = server.url
        model = asyncio.run(run_eval(task, url, tmp_path / "first")).model
    # The server is gone now: every request fails, and each is recorded.
    summary = asyncio.run(run_eval(task, url, tmp_path / "gone", model=model))
    answers = read_answers(tmp_path / "gone")
    assert len(answers) == 3 and all(a.error and not a.correct for a in answers)
    assert summary.failed == 3 and summary.complete


def test_bfcl_settings_need_the_chat_endpoint():
    with pytest.raises(ValueError, match="must be 'chat' for BFCL"):
        BFCLSettings(request=RequestSettings(force_output="none", endpoint="completions"))


def test_a_request_past_its_timeout_is_a_failed_answer(tmp_path: Path):
    task = gsm8k_task(limit=2, request=RequestSettings(force_output="none", timeout_s=0.3))

    def slow(body: dict[str, Any]) -> Response:
        time.sleep(1.0)
        return chat_response("#### 12")

    with scripted_server(slow) as server:
        summary = asyncio.run(run_eval(task, server.url, tmp_path / "slow", model="m"))
    answers = read_answers(tmp_path / "slow")
    assert [a.error for a in answers] == ["timed out after 0.3 s"] * 2
    assert summary.failed == 2 and summary.complete and summary.wall_s < 5
