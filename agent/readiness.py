"""Readiness: health 200 is not "can serve"; a first real completion that reads like text is.

The seeds saw both failure modes this guards against: a server answering /health 200 while
every generation failed with HTTP 500, and one answering `: ok: ok: ok…`. So after the
supervisor sees health 200 (`EngineServer.wait_healthy`, which records `health_s`), the
agent sends the engine's own kind of request (its request extras: thinking off, prompt
cache off) every 0.5 s until one completes with content that passes `looks_degenerate`,
and records both times: `health_s` (start -> health 200) and `first_completion_s`
(health 200 -> that completion's last byte). The output length is not forced here: a
forced length past the natural end is where models start repeating themselves.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

from pydantic import Field

from agent.loadgen.client import ChatRequest, OpenAIClient
from contract.errors import BenchError
from contract.frozen import FrozenModel
from contract.suite import RequestSettings

__all__ = [
    "READY_MAX_TOKENS",
    "READY_POLL_S",
    "READY_PROMPT",
    "NotReadyError",
    "ReadyResult",
    "looks_degenerate",
    "wait_ready",
    "wait_ready_sync",
]

log = logging.getLogger(__name__)

READY_POLL_S = 0.5
# An answer of a few dozen tokens that a working model words differently each time it is
# asked in other words, and that a broken one turns into a loop.
READY_PROMPT = "Name three colours and one animal, in one short sentence."
READY_MAX_TOKENS = 32
TEXT_KEEP = 200  # characters of the accepted reply kept in the result
PROBLEMS_KEPT = 10

# The seeds' rules (seed repo: the JAX server's looks_degenerate, the Ollama rig's check):
# longer than 40 characters and either >= 8 words with <= 2 distinct, or <= 6 distinct
# non-space characters, or >= 6 words with <= max(2, words // 4) distinct.
_LONG = 40
# A short unit said over and over (": ok: ok: ok"): caught at any length from 12 chars.
_REPEAT_RE = re.compile(r"^(.{1,8}?)\1{2,}(.{0,8})$", re.DOTALL)
_REPEAT_MIN_CHARS = 12


def looks_degenerate(text: str) -> str | None:
    """Why `text` is not a real reply (a short phrase), or None if it reads like one."""
    stripped = " ".join(text.split())
    if not stripped:
        return "empty reply"
    if len(stripped) >= _REPEAT_MIN_CHARS:
        m = _REPEAT_RE.match(stripped)
        if m and m.group(1).startswith(m.group(2)):
            return f"one short unit repeated: {m.group(1)!r}"
    if len(stripped) > _LONG:
        words = stripped.split()
        distinct = len(set(words))
        if len(words) >= 8 and distinct <= 2:
            return f"{len(words)} words, only {distinct} distinct"
        chars = len(set(stripped.replace(" ", "")))
        if chars <= 6:
            return f"only {chars} distinct characters in {len(stripped)}"
        if len(words) >= 6 and distinct <= max(2, len(words) // 4):
            return f"{len(words)} words, only {distinct} distinct"
    return None


class ReadyResult(FrozenModel):
    """How long until a server could really serve, or why it never could."""

    engine: str
    ok: bool
    health_s: float | None = Field(description="server start -> health 200 (supervisor's)")
    first_completion_s: float | None = Field(
        description="health 200 -> end of the first completion that passed the check"
    )
    ready_s: float | None = Field(description="health_s + first_completion_s")
    attempts: int = Field(ge=0)
    rejected: int = Field(ge=0, description="attempts that failed or read as degenerate")
    reason: str | None = Field(description="why not ready (the last problem), when not ok")
    problems: tuple[str, ...] = Field(description=f"distinct problems seen (first {PROBLEMS_KEPT})")
    text: str | None = Field(description=f"the accepted reply (first {TEXT_KEEP} characters)")
    prompt: str
    max_tokens: int

    def require(self) -> ReadyResult:
        """self if ready, else `NotReadyError` naming the engine and the reason."""
        if not self.ok:
            raise NotReadyError(self)
        return self


class NotReadyError(BenchError, RuntimeError):
    """The server never produced a real completion in time; `result` says what it did."""

    def __init__(self, result: ReadyResult) -> None:
        self.result = result
        self.engine = result.engine
        super().__init__(
            f"{result.engine}: not ready after {result.attempts} attempts: {result.reason}"
        )


async def wait_ready(
    base_url: str,
    *,
    engine: str,
    timeout_s: float,
    settings: RequestSettings | None = None,
    model: str | None = None,
    health_s: float | None = None,
    poll_s: float = READY_POLL_S,
    prompt: str = READY_PROMPT,
    max_tokens: int = READY_MAX_TOKENS,
    check: Callable[[str], str | None] | None = looks_degenerate,
    alive: Callable[[], bool] | None = None,
) -> ReadyResult:
    """Poll real completions every `poll_s` until one passes `check`, for `timeout_s` at most.

    Call it once health is 200. `settings` are the engine's request settings (from
    `RenderedServe.request_settings`); the output length is never forced here. `model` is
    the name requests carry (None: the first of /v1/models). `alive`, if given, is asked
    between attempts so that a server that died stops the wait at once. `check=None`
    accepts any completion with content. Never raises for a server's failure: the result
    says what happened (`ReadyResult.require()` turns a failure into `NotReadyError`).
    """
    base = settings or RequestSettings()
    request_settings = base.model_copy(
        update={"force_output": "none", "timeout_s": max(1.0, timeout_s)}
    )
    started = time.monotonic()
    deadline = started + timeout_s
    attempts = rejected = 0
    problems: list[str] = []
    last: str | None = None

    def note(problem: str) -> None:
        nonlocal last
        last = problem
        if problem not in problems and len(problems) < PROBLEMS_KEPT:
            problems.append(problem)

    def result(ok: bool, text: str | None = None) -> ReadyResult:
        first = time.monotonic() - started if ok else None
        return ReadyResult(
            engine=engine,
            ok=ok,
            health_s=health_s,
            first_completion_s=first,
            ready_s=(health_s + first) if health_s is not None and first is not None else None,
            attempts=attempts,
            rejected=rejected,
            reason=None if ok else (last or "no attempt finished in time"),
            problems=tuple(problems),
            text=text[:TEXT_KEEP] if text is not None else None,
            prompt=prompt,
            max_tokens=max_tokens,
        )

    async with OpenAIClient(
        base_url, model=model, settings=request_settings, max_connections=1
    ) as client:
        while True:
            if alive is not None and not alive():
                note("server process exited")
                return result(False)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                note(f"timed out after {timeout_s:.1f} s ({last or 'no answer'})")
                return result(False)
            attempts += 1
            try:
                text = await asyncio.wait_for(
                    _attempt(client, prompt, max_tokens, attempts), timeout=remaining
                )
            except TimeoutError:
                rejected += 1
                note(f"no completion within {timeout_s:.1f} s")
                continue
            except _NotYet as exc:
                rejected += 1
                note(str(exc))
            else:
                problem = check(text) if check is not None else None
                if problem is None:
                    log.info(
                        "%s: ready: first real completion %.2f s after health (%d attempts)",
                        engine,
                        time.monotonic() - started,
                        attempts,
                    )
                    return result(True, text)
                rejected += 1
                note(f"degenerate reply ({problem}): {text[:60]!r}")
            log.debug("%s: not ready yet (attempt %d): %s", engine, attempts, last)
            await asyncio.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))


class _NotYet(Exception):
    """One attempt failed (no server info, HTTP error, no content)."""


async def _attempt(client: OpenAIClient, prompt: str, max_tokens: int, n: int) -> str:
    if client.model is None:
        try:
            await client.server_info()
        except ConnectionError as exc:
            raise _NotYet(str(exc)) from None
    record = await client.send(
        ChatRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            label="ready",
            request_id=f"ready-{n}",
            keep_text=True,
        )
    )
    if record.error is not None:
        raise _NotYet(record.error)
    text = record.text or ""
    if not text.strip() and record.reasoning_chunks:
        raise _NotYet("reasoning only, no content (is thinking off?)")
    return text


def wait_ready_sync(base_url: str, **kwargs: object) -> ReadyResult:
    """`wait_ready` for callers without an event loop."""
    # Ignored below: kwargs are wait_ready's keyword arguments, passed through unchanged.
    return asyncio.run(wait_ready(base_url, **kwargs))  # type: ignore[arg-type]
