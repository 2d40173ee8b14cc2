"""The OpenAI-compatible client: request bodies, one streamed request -> one `RequestRecord`.

The hot path goes through a `Transport`; everything else (models, tokenize, server props)
goes through httpx. A failed request comes back as a record with `error` set; only a
programming error raises. The unmeasured calls are retried with a bounded backoff (a
keep-alive connection the server closed while idle, a restart, a brief 5xx) and then raise
`ServerCallError`, which the sweep turns into a failed cell.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import orjson

from agent.loadgen.sse import StreamRecorder
from agent.loadgen.transport import Transport, TransportName, make_transport
from contract.errors import BenchError
from contract.results import ChunkTokenSource, ForcedOutput, RequestRecord
from contract.suite import RequestSettings

__all__ = ["ChatRequest", "OpenAIClient", "ServerCallError", "ServerInfo", "normalise_base_url"]

log = logging.getLogger(__name__)

API_KEY_ENV = "BENCH_API_KEY"
# Waits between attempts of an unmeasured call: four attempts within about two seconds.
RETRY_DELAYS_S = (0.2, 0.5, 1.2)


class ServerCallError(BenchError, ConnectionError):
    """The server under test is unusable: an unmeasured call (models, tokenize, props) failed
    after its retries, it refused the key or does not serve the model, or a URL names no
    server. One line."""


_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def normalise_base_url(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000' (paths are added per endpoint)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        raise ServerCallError(f"URL {url!r} needs a scheme, e.g. http://127.0.0.1:8080")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What to send: the prompt and the lengths asked for, plus where the record belongs."""

    prompt: str
    max_tokens: int
    label: str
    request_id: str
    phase: str = "measured"
    input_tokens_target: int | None = None
    keep_text: bool = False


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the server says about itself, where it says it."""

    model: str
    max_context_tokens: int | None


def _forced(mode: str) -> list[ForcedOutput]:
    parts: tuple[ForcedOutput, ...] = ("ignore_eos", "min_tokens")
    return [part for part in parts if part in mode]


class OpenAIClient:
    """One server, one model, one set of request settings."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        settings: RequestSettings | None = None,
        transport: TransportName = "fast",
        max_connections: int = 64,
    ) -> None:
        self.base_url = normalise_base_url(base_url)
        self.settings = settings or RequestSettings()
        self.model = model
        # The key is read here and kept in memory only: never logged, never in argv.
        self._api_key = os.environ.get(API_KEY_ENV) or None
        self._transport: Transport = make_transport(
            transport, self.base_url, api_key=self._api_key, max_connections=max_connections
        )
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30.0)
        self.forced_output = _forced(self.settings.force_output)

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._transport.aclose()
        await self._http.aclose()

    async def warm(self, connections: int) -> None:
        await self._transport.warm(connections)

    async def _call(
        self, method: str, path: str, json: Mapping[str, object] | None = None
    ) -> httpx.Response:
        """One unmeasured call, retried on transport errors and 5xx; raises `ServerCallError`."""
        last = ""
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            if attempt:
                await asyncio.sleep(RETRY_DELAYS_S[attempt - 1])
            try:
                response = await self._http.request(method, path, json=json)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                continue
            if response.status_code < 500:
                return response
            last = f"HTTP {response.status_code}"
        raise ServerCallError(
            f"{method} {self.base_url}{path} failed {len(RETRY_DELAYS_S) + 1} times: {last}"
        )

    async def server_info(self) -> ServerInfo:
        """The served model id and context length, from /v1/models (and llama.cpp's /props).

        Raises `ServerCallError` with one clear line if the server cannot be reached, refuses
        the key, or does not serve the model asked for.
        """
        try:
            response = await self._call("GET", "/v1/models")
        except ServerCallError as exc:
            raise ServerCallError(f"cannot reach {self.base_url}: {exc}") from exc
        if response.status_code in (401, 403):
            hint = "is BENCH_API_KEY right?" if self._api_key else "set BENCH_API_KEY to its key"
            raise ServerCallError(
                f"{self.base_url}/v1/models answered HTTP {response.status_code}: {hint}"
            )
        if response.status_code != 200:
            raise ServerCallError(f"{self.base_url}/v1/models answered HTTP {response.status_code}")
        try:
            entries = response.json().get("data") or []
        except ValueError as exc:
            raise ServerCallError(f"{self.base_url}/v1/models did not return JSON") from exc
        if not entries:
            raise ServerCallError(f"{self.base_url}/v1/models lists no model")
        served = [str(e.get("id")) for e in entries]
        if self.model is not None and self.model not in served:
            raise ServerCallError(
                f"model {self.model!r} is not served by {self.base_url}; "
                f"/v1/models lists: {', '.join(served)}"
            )
        entry = next((e for e in entries if e.get("id") == self.model), entries[0])
        context = entry.get("max_model_len") or (entry.get("meta") or {}).get("n_ctx_train")
        slot_context = await self._llamacpp_slot_context()
        if slot_context:
            context = slot_context
        if self.model is None:
            self.model = str(entry["id"])
        return ServerInfo(model=self.model, max_context_tokens=int(context) if context else None)

    async def _llamacpp_slot_context(self) -> int | None:
        try:
            response = await self._call("GET", "/props")
        except ServerCallError:
            return None
        if response.status_code != 200:
            return None
        try:
            settings = response.json().get("default_generation_settings") or {}
        except ValueError:
            return None
        n_ctx = settings.get("n_ctx")
        return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None

    def body(self, request: ChatRequest) -> bytes:
        s = self.settings
        payload: dict[str, object] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
        }
        if s.endpoint == "chat":
            payload["messages"] = [{"role": "user", "content": request.prompt}]
            payload["chat_template_kwargs"] = {"enable_thinking": s.thinking}
        else:
            payload["prompt"] = request.prompt
        if "ignore_eos" in self.forced_output:
            payload["ignore_eos"] = True
        if "min_tokens" in self.forced_output:
            payload["min_tokens"] = request.max_tokens
        payload.update(s.extra_body)
        return orjson.dumps(payload)

    async def send(self, request: ChatRequest, *, dispatch_ns: int | None = None) -> RequestRecord:
        """Stream one request and return its record; never raises for a failed request."""
        dispatch = dispatch_ns if dispatch_ns is not None else time.perf_counter_ns()
        recorder = StreamRecorder(keep_text=True)
        result = await self._transport.stream(
            _PATHS[self.settings.endpoint],
            self.body(request),
            recorder,
            self.settings.timeout_s,
            request.request_id,
        )
        return _to_record(request, recorder, result.send_ns, dispatch, self)

    async def tokenize_raw(self, text: str) -> int | None:
        """Token count of `text` without special tokens, where the server can tell.

        Raises `ServerCallError` when the server cannot be reached after the retries.
        """
        response = await self._call(
            "POST", "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        tokens = _json_tokens(response)
        if tokens:
            return len(tokens)
        # llama.cpp's spelling of the same endpoint.
        response = await self._call("POST", "/tokenize", {"content": text, "add_special": False})
        tokens = _json_tokens(response)
        return len(tokens) if tokens is not None else None


def _json_tokens(response: httpx.Response) -> list[object] | None:
    if response.status_code != 200:
        return None
    try:
        tokens = response.json().get("tokens")
    except (ValueError, AttributeError):
        return None
    return tokens if isinstance(tokens, list) else None


def _chunk_tokens(
    recorder: StreamRecorder, completion_tokens: int | None
) -> tuple[list[int], ChunkTokenSource]:
    chunks = len(recorder.chunk_ns)
    if not chunks:
        return [], "none"
    cumulative = recorder.cumulative_tokens()
    if all(c is not None for c in cumulative):
        previous = 0
        per_chunk = []
        for c in cumulative:
            assert c is not None
            per_chunk.append(max(0, c - previous))
            previous = c
        return per_chunk, "continuous_usage"
    if completion_tokens is None or completion_tokens == chunks:
        return [1] * chunks, "one_per_chunk"
    # Several tokens per event (speculative decoding, coalesced deltas): share the usage
    # count out by text length, largest remainder first, so the total stays exact.
    chars = recorder.chunk_chars
    total_chars = sum(chars) or chunks
    shares = [completion_tokens * (c or 1) / total_chars for c in chars]
    per_chunk = [int(s) for s in shares]
    remainder = completion_tokens - sum(per_chunk)
    by_fraction = sorted(range(chunks), key=lambda i: shares[i] - per_chunk[i], reverse=True)
    for i in by_fraction[: max(0, remainder)]:
        per_chunk[i] += 1
    return per_chunk, "proportional_to_text"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def _to_record(
    request: ChatRequest,
    recorder: StreamRecorder,
    send_ns: int,
    dispatch_ns: int,
    client: OpenAIClient,
) -> RequestRecord:
    usage = recorder.usage or {}
    timings = recorder.timings or {}
    completion = _int_or_none(usage.get("completion_tokens"))
    details = usage.get("completion_tokens_details")
    prompt_details = usage.get("prompt_tokens_details")
    error = recorder.error
    if error is None and recorder.http_status is not None and recorder.http_status >= 400:
        error = f"HTTP {recorder.http_status}"
    if error is None and not recorder.chunk_ns:
        error = "stream ended without any content"
    per_chunk, source = _chunk_tokens(recorder, completion)
    token_events = recorder.content_chunks + recorder.reasoning_chunks
    mismatch = (completion - token_events) if completion is not None and token_events else None
    return RequestRecord(
        request_id=request.request_id,
        label=request.label,
        phase="warmup" if request.phase == "warmup" else "measured",
        endpoint=client.settings.endpoint,
        dispatch_ns=dispatch_ns,
        send_ns=send_ns,
        first_chunk_ns=recorder.first_chunk_ns,
        first_token_ns=recorder.first_token_ns,
        first_content_ns=recorder.first_content_ns,
        last_token_ns=recorder.last_token_ns,
        end_ns=recorder.end_ns,
        chunk_ns=recorder.chunk_ns,
        chunk_tokens=per_chunk,
        chunk_tokens_source=source,
        content_chunks=recorder.content_chunks,
        reasoning_chunks=recorder.reasoning_chunks,
        content_chars=recorder.content_chars,
        reasoning_chars=recorder.reasoning_chars,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=completion,
        reasoning_tokens=_int_or_none(details.get("reasoning_tokens"))
        if isinstance(details, dict)
        else None,
        cached_prompt_tokens=_int_or_none(prompt_details.get("cached_tokens"))
        if isinstance(prompt_details, dict)
        else None,
        draft_tokens=_int_or_none(timings.get("draft_n")),
        draft_accepted_tokens=_int_or_none(timings.get("draft_n_accepted")),
        input_tokens_target=request.input_tokens_target,
        output_tokens_target=request.max_tokens,
        forced_output=client.forced_output,
        usage_chunk_mismatch=mismatch,
        finish_reason=recorder.finish_reason,
        text_sha256=recorder.text_sha256(),
        text=recorder.text if request.keep_text else None,
        http_status=recorder.http_status,
        error=error,
    )
