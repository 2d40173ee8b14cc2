"""The HTTP layer: OpenAI-compatible routes on Starlette, served by uvicorn.

Routes: /v1/chat/completions, /v1/completions (streaming as server-sent events or not),
/v1/models, /health, /tokenize, /detokenize, /version, /metrics. This module validates
and tokenizes requests, hands them to the scheduler, and turns its `StepOutput`s into
responses; a bad request gets a 4xx with a one-line message naming the field, and a
request that fails inside the engine gets an error of its own while the others go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import torch
import transformers
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engines.pytorch.config import EngineConfig
from engines.pytorch.metrics import EngineMetrics
from engines.pytorch.model import LoadedModel
from engines.pytorch.profiling import DecodeProfiler
from engines.pytorch.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponseShapes,
    TokenizeRequest,
    validation_message,
)
from engines.pytorch.sampling import SamplingParams
from engines.pytorch.scheduler import GenerationRequest, Scheduler, StepOutput

log = logging.getLogger(__name__)

ENGINE_VERSION = "0.1.0"
OWNER = "llm-serving-bench"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


@dataclass
class EngineState:
    """What the routes share: the model, the scheduler, metrics, names and limits."""

    config: EngineConfig
    loaded: LoadedModel
    scheduler: Scheduler
    metrics: EngineMetrics

    @property
    def model_name(self) -> str:
        return self.loaded.name


def _error(err: ApiError) -> Response:
    return OrjsonResponse(err.body(), status_code=err.status)


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = validation_message(e)
        raise ApiError(400, message, param) from None


def _check_model(state: EngineState, name: str | None) -> None:
    if name is not None and name != state.model_name:
        raise ApiError(
            404,
            f"The model `{name}` does not exist; this server serves `{state.model_name}`.",
            "model",
        )


def _chat_prompt(
    state: EngineState,
    messages: list[Any],
    kwargs: dict[str, Any] | None,
    add_generation_prompt: bool,
) -> str:
    try:
        rendered = [m.to_template() for m in messages]
        return state.loaded.tokenizer.apply_chat_template(
            rendered,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **(kwargs or {}),
        )
    except ValueError as e:
        raise ApiError(400, str(e), "messages") from None
    except Exception as e:  # jinja errors from a template: the request's messages or kwargs
        raise ApiError(400, f"chat template failed: {e}", "messages") from None


def _sampling_params(
    state: EngineState, body: Any, prompt_len: int, max_tokens: int | None
) -> SamplingParams:
    limit = state.loaded.max_model_len
    if prompt_len == 0:
        raise ApiError(400, "prompt: the prompt is empty", "prompt")
    if prompt_len >= limit:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens, and your prompt has "
            f"{prompt_len} tokens, leaving no room to generate. Shorten the prompt.",
            "prompt",
        )
    if max_tokens is None:
        max_tokens = limit - prompt_len
    elif prompt_len + max_tokens > limit:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} in the "
            "completion). Reduce the prompt or max_tokens.",
            "max_tokens",
        )
    if body.min_tokens > max_tokens:
        raise ApiError(
            400, f"min_tokens: {body.min_tokens} is more than max_tokens {max_tokens}", "min_tokens"
        )
    vocab = state.loaded.tokenizer_vocab_size
    bad_ids = [i for i in body.stop_token_ids or () if not 0 <= i < vocab]
    if bad_ids:
        raise ApiError(
            400,
            f"stop_token_ids: ids out of the vocabulary (0..{vocab - 1}): {bad_ids}",
            "stop_token_ids",
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        stop=body.stop_strings(),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
    )


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _generate(
    state: EngineState,
    kind: Literal["chat", "text"],
    body: Any,
    prompt_ids: list[int],
    max_tokens: int | None,
) -> Response:
    params = _sampling_params(state, body, len(prompt_ids), max_tokens)
    request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    shapes = ResponseShapes(kind, request_id, state.model_name)
    outputs: asyncio.Queue[StepOutput] = asyncio.Queue()
    state.scheduler.submit(GenerationRequest(request_id, tuple(prompt_ids), params), outputs)
    if body.stream:
        options = body.stream_options
        include_usage = bool(options and options.include_usage)
        continuous = bool(options and options.continuous_usage_stats)
        return StreamingResponse(
            _stream(state, shapes, outputs, request_id, include_usage, continuous),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    finished = False
    try:
        parts: list[str] = []
        while True:
            out = await outputs.get()
            parts.append(out.text)
            if out.finished:
                finished = True
                break
    finally:
        if not finished:  # the client went away: free the slot
            state.scheduler.abort(request_id)
    if out.error is not None:
        raise ApiError(500, f"generation failed: {out.error}")
    return OrjsonResponse(shapes.response("".join(parts), out))


async def _stream(
    state: EngineState,
    shapes: ResponseShapes,
    outputs: asyncio.Queue[StepOutput],
    request_id: str,
    include_usage: bool,
    continuous_usage: bool,
) -> AsyncIterator[bytes]:
    finished = False
    try:
        if shapes.kind == "chat":
            yield _sse(shapes.role_chunk())
        while True:
            out = await outputs.get()
            if out.error is not None:
                finished = True
                yield _sse(ApiError(500, f"generation failed: {out.error}").body())
                break
            # Usage rides on every final chunk; on every chunk when asked for continuously.
            yield _sse(shapes.chunk(out, with_usage=continuous_usage or out.finished))
            if out.finished:
                finished = True
                if include_usage:
                    yield _sse(shapes.usage_chunk(out))
                break
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:
            state.scheduler.abort(request_id)


def build_app(state: EngineState) -> Starlette:
    """The Starlette app over a loaded model and a (not yet started) scheduler."""

    def route(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as e:
                if e.status >= 500:
                    log.error("%s %s: %s", request.method, request.url.path, e.message)
                return _error(e)
            except Exception as e:
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(ApiError(500, f"internal error: {type(e).__name__}: {e}"))

        return wrapped

    tokenizer = state.loaded.tokenizer

    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = await _body(request, ChatCompletionRequest)
        _check_model(state, body.model)
        text = _chat_prompt(
            state, body.messages, body.chat_template_kwargs, body.add_generation_prompt
        )
        # The template writes BOS itself where the model wants one.
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
        max_tokens = (
            body.max_completion_tokens
            if body.max_completion_tokens is not None
            else body.max_tokens
        )
        return await _generate(state, "chat", body, prompt_ids, max_tokens)

    async def completions(request: Request) -> Response:
        body: CompletionRequest = await _body(request, CompletionRequest)
        _check_model(state, body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=True)
        else:
            vocab = state.loaded.tokenizer_vocab_size
            if any(not isinstance(i, int) or not 0 <= i < vocab for i in prompt):
                raise ApiError(400, f"prompt: token ids must be in 0..{vocab - 1}", "prompt")
            prompt_ids = list(prompt)
        return await _generate(state, "text", body, prompt_ids, body.max_tokens)

    async def tokenize(request: Request) -> Response:
        body: TokenizeRequest = await _body(request, TokenizeRequest)
        _check_model(state, body.model)
        if body.messages is not None:
            text = _chat_prompt(
                state, body.messages, body.chat_template_kwargs, body.add_generation_prompt
            )
            add_special = bool(body.add_special_tokens)
        else:
            text = body.prompt or ""
            add_special = True if body.add_special_tokens is None else body.add_special_tokens
        tokens = tokenizer.encode(text, add_special_tokens=add_special)
        return OrjsonResponse(
            {
                "count": len(tokens),
                "max_model_len": state.loaded.max_model_len,
                "tokens": tokens,
                "token_strs": None,
            }
        )

    async def detokenize(request: Request) -> Response:
        body: DetokenizeRequest = await _body(request, DetokenizeRequest)
        _check_model(state, body.model)
        vocab = state.loaded.tokenizer_vocab_size
        if any(not 0 <= i < vocab for i in body.tokens):
            raise ApiError(400, f"tokens: ids must be in 0..{vocab - 1}", "tokens")
        return OrjsonResponse({"prompt": tokenizer.decode(body.tokens)})

    async def models(request: Request) -> Response:
        card = {
            "id": state.model_name,
            "object": "model",
            "created": 0,
            "owned_by": OWNER,
            "root": state.config.model,
            "parent": None,
            "max_model_len": state.loaded.max_model_len,
        }
        return OrjsonResponse({"object": "list", "data": [card]})

    async def health(request: Request) -> Response:
        if not state.scheduler.alive:
            raise ApiError(503, "the engine's scheduler is not running")
        return OrjsonResponse({"status": "ok"})

    async def version(request: Request) -> Response:
        return OrjsonResponse(
            {
                "version": ENGINE_VERSION,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "device": str(state.loaded.device),
                "dtype": str(state.loaded.dtype).removeprefix("torch."),
                "batch_invariant": state.scheduler.runner.invariant is not None,
                "quantization": None
                if state.loaded.quantization is None
                else state.loaded.quantization.summary(),
            }
        )

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def dispatch(batch: list[tuple[object, StepOutput]]) -> None:
            for handle, out in batch:
                handle.put_nowait(out)  # type: ignore[attr-defined]

        def deliver(batch: list[tuple[object, StepOutput]]) -> None:
            # Called on the scheduler thread: one hop onto the loop per step, not per token.
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(dispatch, batch)

        state.scheduler.deliver = deliver
        state.scheduler.start()
        log.info("serving %s", state.model_name)
        try:
            yield
        finally:
            state.scheduler.shutdown()

    routes = [
        Route("/v1/chat/completions", route(chat_completions), methods=["POST"]),
        Route("/v1/completions", route(completions), methods=["POST"]),
        Route("/tokenize", route(tokenize), methods=["POST"]),
        Route("/detokenize", route(detokenize), methods=["POST"]),
        Route("/v1/models", route(models), methods=["GET"]),
        Route("/health", route(health), methods=["GET"]),
        Route("/version", route(version), methods=["GET"]),
        Route("/metrics", route(metrics), methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def create_state(config: EngineConfig) -> EngineState:
    """Load the model and build the runner and scheduler (not started) for `config`."""
    from engines.pytorch.model import load_model
    from engines.pytorch.runner import ModelRunner

    if config.threads > 0:
        torch.set_num_threads(config.threads)
    loaded = load_model(
        config.model,
        dtype=config.dtype,
        device=config.device,
        seed=config.seed,
        max_model_len=config.max_model_len,
        served_name=config.served_model_name,
        quantize=config.quantize,
    )
    device_type = loaded.device.type
    runner = ModelRunner(
        loaded,
        num_slots=config.max_running,
        batch_invariant=config.batch_invariant_on(device_type),
        batched_decode=config.batched_decode_on(device_type),
        cuda_graphs=config.cuda_graphs_on(device_type),
        packed_prefill=config.packed_prefill_on(device_type),
        fused_norms=config.fused_norms_on(device_type),
        compile_mode=config.compile_mode_for(device_type),
        compile_without_program=config.compile_mode != "auto",
        decode_program=config.decode_program_on(device_type),
        triton_gemv=config.triton_gemv_on(device_type),
        attention_form=config.attention_form,
        dependent_launch=config.dependent_launch == "auto",
    )
    if runner.graphs is not None and config.graph_warmup_len > 0:
        # Before /health answers: the first requests should not wait for captures.
        count = runner.warmup_graphs(config.graph_warmup_len)
        log.info("captured %d decode graphs in %.1fs", count, runner.graphs.capture_s)
    metrics = EngineMetrics(loaded.name)

    def not_started(batch: list[tuple[object, StepOutput]]) -> None:
        raise RuntimeError("scheduler outputs delivered before the server started")

    scheduler = Scheduler(
        runner,
        max_running=config.max_running,
        metrics=metrics,
        deliver=not_started,
        prefill_chunk=config.prefill_chunk,
        prefill_budget=config.prefill_budget,
        async_decode=config.async_decode == "on",
        profiler=DecodeProfiler(
            Path(config.profile_dir), config.profile_decode_steps, loaded.device
        )
        if config.profile_dir
        else None,
    )
    return EngineState(config=config, loaded=loaded, scheduler=scheduler, metrics=metrics)


def serve(config: EngineConfig) -> None:
    """Load, then serve until interrupted (uvicorn handles SIGINT/SIGTERM)."""
    import uvicorn

    state = create_state(config)
    app = build_app(state)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
