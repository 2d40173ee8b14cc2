"""The OpenAI-compatible wire format: request bodies (pydantic, validated with one-line
errors naming the field) and the response and stream-chunk shapes, which follow vLLM's.

Unknown request fields are ignored, as OpenAI clients send many this engine has no use
for; fields whose meaning it cannot honour (n > 1, logprobs, echo) are refused.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contract.errors import BenchError
from engines.serving.requests import StepOutput


class ApiError(BenchError):
    """An error answered to the client: HTTP status, message, OpenAI error type, field."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "BadRequestError"),
                "param": self.param,
                "code": self.status,
            }
        }


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """One line naming the first bad field, and that field's name."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        return f"{loc}: field required", loc or None
    return (f"{loc}: {msg}" if loc else msg), loc or None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _GenerationRequest(BaseModel):
    """Fields shared by chat and text completions (OpenAI's, plus vLLM's extensions)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: Any = None
    user: str | None = None

    @model_validator(mode="after")
    def _supported(self) -> _GenerationRequest:
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        if self.logprobs not in (None, False):
            raise ValueError("logprobs: not supported by this engine")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as chat templates expect it, with text parts joined."""
        content = self.content
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ValueError(
                        f"messages: content part type {part.type!r} is not supported (text only)"
                    )
                texts.append(part.text)
            content = "".join(texts)
        extra = {k: v for k, v in (self.model_extra or {}).items() if v is not None}
        return {**extra, "role": self.role, "content": content or ""}


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    top_logprobs: int | None = None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str]
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _single_prompt(self) -> CompletionRequest:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str) and len(prompt) != 1:
            raise ValueError("prompt: only one prompt per request is supported")
        if self.echo:
            raise ValueError("echo: not supported by this engine")
        if self.suffix:
            raise ValueError("suffix: not supported by this engine")
        return self


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: either a prompt or chat messages."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


# -- responses ------------------------------------------------------------------------


def usage(out: StepOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
        "completion_tokens": out.completion_tokens,
        "prompt_tokens_details": None,
    }


class ResponseShapes:
    """Builds one request's response bodies and stream chunks (chat or text completion)."""

    def __init__(self, kind: Literal["chat", "text"], request_id: str, model: str) -> None:
        self.kind = kind
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"
        self.chunk_object = "chat.completion.chunk" if kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role_chunk(self) -> dict[str, Any]:
        """Chat streams open with the assistant role and empty content, as vLLM's do."""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._envelope(self.chunk_object, [choice])

    def chunk(self, out: StepOutput, *, with_usage: bool) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {"content": out.text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": out.text, "logprobs": None}
        choice["finish_reason"] = out.finish_reason
        choice["stop_reason"] = out.stop_reason
        body = self._envelope(self.chunk_object, [choice])
        if with_usage:
            body["usage"] = usage(out)
        return body

    def usage_chunk(self, last: StepOutput) -> dict[str, Any]:
        body = self._envelope(self.chunk_object, [])
        body["usage"] = usage(last)
        return body

    def response(self, text: str, last: StepOutput) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = last.finish_reason
        choice["stop_reason"] = last.stop_reason
        body = self._envelope(self.object, [choice])
        body["usage"] = usage(last)
        return body
