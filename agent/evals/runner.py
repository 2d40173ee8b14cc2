"""The eval runner: every question asked once, `concurrency` at a time, scored as it comes.

Owns the request loop of the answer-quality evals. Each question is one non-streaming
request over plain httpx to any OpenAI-compatible server: greedy, thinking off
(`chat_template_kwargs.enable_thinking=false`), the eval's token cap. Its `AnswerRecord` is
handed to the job folder (`agent.jobfolder`: `answers.jsonl`) and `summary.json` is rewritten
at once, so a lost instance keeps every answer scored so far. A failed request, or a reply
that cannot be read, is scored wrong with its reason; only a programming error or an
unwritable folder stops the run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from agent.evals.bfcl import BFCLTask
from agent.evals.gsm8k import GSM8K_TEST_SHA256, GSM8KTask, fetch_gsm8k
from agent.evals.task import EvalTask, Prepared, Question, Reply, Scored
from agent.jobfolder import JobFolder
from agent.loadgen.client import API_KEY_ENV, normalise_base_url
from contract.evals import (
    AnswerRecord,
    BFCLSettings,
    EvalSummary,
    GSM8KSettings,
    MarkCount,
    ToolCall,
)

__all__ = ["load_task", "run_eval"]

log = logging.getLogger(__name__)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
_MAX_ERRORS_KEPT = 5
_ERROR_BODY_CHARS = 300

ProgressHook = Callable[[AnswerRecord], None]


def load_task(
    settings: GSM8KSettings | BFCLSettings,
    *,
    data_path: Path | None = None,
    data_sha256: str | None = GSM8K_TEST_SHA256,
    train_path: Path | None = None,
    cache_dir: Path | None = None,
) -> EvalTask[Any]:
    """The task for these settings, its data loaded and checked.

    GSM8K reads `data_path` when given (a local copy, still checked against the pin unless
    `data_sha256` says otherwise), else downloads the pinned test split into `cache_dir`.
    BFCL's data ships inside the bfcl-eval package.
    """
    if isinstance(settings, BFCLSettings):
        return BFCLTask(settings)
    if data_path is None:
        folder = cache_dir or Path(tempfile.gettempdir()) / "bench-data"
        data_path = fetch_gsm8k(folder / "gsm8k-test.jsonl")
        data_sha256 = GSM8K_TEST_SHA256
    return GSM8KTask.from_file(settings, data_path, sha256=data_sha256, train_path=train_path)


@dataclass(slots=True)
class _Sent:
    reply: Reply
    latency_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    http_status: int | None
    error: str | None


def _body(task: EvalTask[Any], model: str, prepared: Prepared) -> bytes:
    settings = task.settings
    request = settings.request
    payload: dict[str, Any] = {
        "model": model,
        "max_tokens": settings.max_tokens,
        "temperature": request.temperature,
        "stream": False,
    }
    if request.endpoint == "chat":
        payload["messages"] = prepared.messages
        payload["chat_template_kwargs"] = {"enable_thinking": request.thinking}
    else:
        payload["prompt"] = prepared.prompt
    if prepared.tools:
        payload["tools"] = prepared.tools
    if prepared.stop:
        payload["stop"] = prepared.stop
    payload.update(request.extra_body)
    return orjson.dumps(payload)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse_reply(data: object) -> tuple[Reply, dict[str, Any]]:
    """An OpenAI chat or text completion -> Reply and its usage; ValueError if not one."""
    if not isinstance(data, dict):
        raise ValueError("the response is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the response has no choices")
    choice = choices[0]
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    message = choice.get("message")
    if isinstance(message, dict):
        content = message.get("content")
        # vLLM/SGLang say reasoning_content, newer vLLM says reasoning.
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = orjson.dumps(arguments).decode()
            calls.append(ToolCall(name=str(function.get("name") or ""), arguments=arguments))
    else:
        content, reasoning, calls = choice.get("text"), None, []
    reply = Reply(
        content=content if isinstance(content, str) else "",
        reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
        tool_calls=calls,
        finish_reason=choice.get("finish_reason")
        if isinstance(choice.get("finish_reason"), str)
        else None,
    )
    return reply, usage


async def _ask(http: httpx.AsyncClient, path: str, body: bytes, timeout_s: float) -> _Sent:
    status: int | None = None
    start = time.perf_counter()
    try:
        # httpx's timeout bounds each read; this bounds the whole request.
        async with asyncio.timeout(timeout_s):
            response = await http.post(
                path, content=body, headers={"Content-Type": "application/json"}, timeout=timeout_s
            )
        latency = time.perf_counter() - start
        status = response.status_code
        if status >= 400:
            text = response.text[:_ERROR_BODY_CHARS].replace("\n", " ")
            return _Sent(Reply(), latency, None, None, status, f"HTTP {status}: {text}")
        reply, usage = _parse_reply(orjson.loads(response.content))
    except (httpx.TimeoutException, TimeoutError):
        return _Sent(Reply(), None, None, None, status, f"timed out after {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return _Sent(Reply(), None, None, None, status, f"{type(exc).__name__}: {exc}")
    except (orjson.JSONDecodeError, ValueError) as exc:
        return _Sent(
            Reply(), time.perf_counter() - start, None, None, status, f"bad response: {exc}"
        )
    return _Sent(
        reply,
        latency,
        _int_or_none(usage.get("prompt_tokens")),
        _int_or_none(usage.get("completion_tokens")),
        status,
        None,
    )


def _record(task: EvalTask[Any], question: Question, sent: _Sent, max_tokens: int) -> AnswerRecord:
    reply = sent.reply
    truncated = reply.finish_reason == "length" or (
        sent.completion_tokens is not None and sent.completion_tokens >= max_tokens
    )
    if sent.error is not None:
        scored = Scored(
            extracted=None,
            correct=False,
            reason=f"request failed: {sent.error}",
            marks=dict.fromkeys(task.mark_names, False),
        )
    else:
        scored = task.score(question, reply)
    reason = scored.reason
    if truncated and not scored.correct:
        at_cap = sent.completion_tokens is None or sent.completion_tokens >= max_tokens
        # A reply can also be stopped for length by the server's context, below our cap.
        where = f"at the {max_tokens}-token cap" if at_cap else "by the server (length)"
        reason = f"{reason} (cut off {where})"
    return AnswerRecord(
        eval=task.name,
        index=question.index,
        question_id=question.question_id,
        reply=reply.content,
        reasoning=reply.reasoning,
        tool_calls=reply.tool_calls,
        extracted=scored.extracted,
        correct=scored.correct,
        reason=reason,
        marks=scored.marks,
        prompt_tokens=sent.prompt_tokens,
        completion_tokens=sent.completion_tokens,
        latency_s=sent.latency_s,
        finish_reason=reply.finish_reason,
        truncated=truncated,
        http_status=sent.http_status,
        error=sent.error,
        gsm8k=scored.gsm8k,
        bfcl=scored.bfcl,
    )


class _Tally:
    """Running totals for summary.json."""

    def __init__(self, marks: Sequence[str]) -> None:
        self.answered = 0
        self.correct = 0
        self.marks: Counter[str] = Counter({m: 0 for m in marks})
        self.truncated = 0
        self.failed = 0
        self.completion_tokens = 0
        self.errors: list[str] = []

    def add(self, record: AnswerRecord) -> None:
        self.answered += 1
        self.correct += record.correct
        for mark, ok in record.marks.items():
            self.marks[mark] += ok
        self.truncated += record.truncated
        self.completion_tokens += record.completion_tokens or 0
        if record.error is not None:
            self.failed += 1
            if record.error not in self.errors and len(self.errors) < _MAX_ERRORS_KEPT:
                self.errors.append(record.error)


async def _served_model(http: httpx.AsyncClient) -> str:
    try:
        response = await http.get("/v1/models")
        if response.status_code != 200:
            raise ConnectionError(f"{http.base_url}/v1/models answered HTTP {response.status_code}")
        entries = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ConnectionError(f"cannot ask {http.base_url} for its model: {exc}") from exc
    if not entries:
        raise ConnectionError(f"{http.base_url}/v1/models lists no model")
    return str(entries[0]["id"])


async def run_eval(
    task: EvalTask[Any],
    base_url: str,
    job_dir: Path,
    *,
    model: str | None = None,
    progress: ProgressHook | None = None,
) -> EvalSummary:
    """Ask every question of `task`, `settings.concurrency` at a time; write answers.jsonl
    (in the order answers come) and summary.json (rewritten after each)."""
    settings = task.settings
    request = settings.request
    url = normalise_base_url(base_url)
    folder = JobFolder(job_dir)
    folder.remove_summary()
    questions = task.questions()
    api_key = os.environ.get(API_KEY_ENV)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    tally = _Tally(task.mark_names)
    started_unix = time.time()
    started = time.perf_counter()

    def summary(complete: bool) -> EvalSummary:
        return EvalSummary(
            eval=task.name,
            base_url=url,
            model=model or "",
            settings=settings,
            prompt=task.prompt_label,
            data=task.data_label,
            data_sha256=task.data_sha256,
            checker=task.checker_label,
            headline=task.headline,
            questions=len(questions),
            answered=tally.answered,
            correct=tally.correct,
            score=tally.correct / tally.answered if tally.answered else None,
            marks={
                mark: MarkCount(
                    correct=count,
                    n=tally.answered,
                    score=count / tally.answered if tally.answered else None,
                )
                for mark, count in tally.marks.items()
            },
            truncated=tally.truncated,
            failed=tally.failed,
            completion_tokens=tally.completion_tokens,
            started_unix_s=started_unix,
            finished_unix_s=time.time() if complete else None,
            wall_s=time.perf_counter() - started,
            complete=complete,
            errors=tally.errors,
        )

    limits = httpx.Limits(max_connections=settings.concurrency)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=30.0, limits=limits
    ) as http:
        if model is None:
            model = await _served_model(http)
        served: str = model
        log.info(
            "eval %s: %d questions, prompt %s, model %s at %s",
            task.name,
            len(questions),
            task.prompt_label,
            model,
            url,
        )
        folder.start_answers()
        started_unix = time.time()
        started = time.perf_counter()
        pending = iter(questions)

        async def worker() -> None:
            # One shared iterator: each worker takes the next question when it is free.
            for question in pending:
                prepared = task.prepare(question)
                sent = await _ask(
                    http,
                    _PATHS[request.endpoint],
                    _body(task, served, prepared),
                    request.timeout_s,
                )
                record = _record(task, question, sent, settings.max_tokens)
                folder.append_answer(record)
                tally.add(record)
                folder.write_summary(summary(complete=False))
                if progress is not None:
                    progress(record)
                if tally.answered % 50 == 0:
                    log.info(
                        "eval %s: %d/%d answered, %d correct",
                        task.name,
                        tally.answered,
                        len(questions),
                        tally.correct,
                    )

        await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
    final = summary(complete=True)
    folder.write_summary(final)
    log.info(
        "eval %s done: %d/%d correct (%s), %d truncated, %d failed, %.1f s",
        task.name,
        final.correct,
        final.answered,
        task.headline,
        final.truncated,
        final.failed,
        final.wall_s,
    )
    return final
