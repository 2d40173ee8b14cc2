"""Request validation messages and response shapes, without a server."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engines.serving.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ResponseShapes,
    TokenizeRequest,
    validation_message,
)
from engines.serving.requests import StepOutput


def _message(model: type, data: dict) -> str:
    with pytest.raises(ValidationError) as err:
        model.model_validate(data)
    return validation_message(err.value)[0]


def test_validation_messages_name_the_field() -> None:
    assert _message(CompletionRequest, {"prompt": "x", "max_tokens": -1}).startswith("max_tokens: ")
    assert _message(ChatCompletionRequest, {}) == "messages: field required"
    assert (
        _message(ChatCompletionRequest, {"messages": [{"role": "user"}], "n": 3})
        == "n: only n=1 is supported"
    )
    assert "top_p" in _message(CompletionRequest, {"prompt": "x", "top_p": 0})
    assert "prompt" in _message(CompletionRequest, {"prompt": ["a", "b"]})
    assert "exactly one" in _message(TokenizeRequest, {})
    assert _message(CompletionRequest, {"prompt": "x", "seed": 2**64}).startswith("seed: ")


def test_unknown_fields_ignored_and_text_parts_joined() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "frequency_penalty": 0.0,
            "max_completion_tokens": 5,
        }
    )
    assert req.messages[0].to_template() == {"role": "user", "content": "ab"}
    image = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    )
    with pytest.raises(ValueError, match="text only"):
        image.messages[0].to_template()


def test_chunk_and_response_shapes() -> None:
    shapes = ResponseShapes("chat", "chatcmpl-1", "m")
    out = StepOutput("hi", (1,), prompt_tokens=3, completion_tokens=2, finish_reason="stop")
    chunk = shapes.chunk(out, with_usage=True)
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {"content": "hi"}
    assert chunk["usage"] == {
        "prompt_tokens": 3,
        "total_tokens": 5,
        "completion_tokens": 2,
        "prompt_tokens_details": None,
    }
    assert shapes.usage_chunk(out)["choices"] == []
    text = ResponseShapes("text", "cmpl-1", "m").response("hello", out)
    assert text["object"] == "text_completion"
    assert text["choices"][0]["text"] == "hello" and text["choices"][0]["finish_reason"] == "stop"
