"""Streaming text from ids: split UTF-8 characters arrive whole; stop strings never leak."""

from __future__ import annotations

from engines.serving.detokenizer import TextStream
from engines.serving.tokenizer import build_byte_tokenizer


def _feed(stream: TextStream, text: str) -> list[str]:
    deltas = []
    for b in text.encode("utf-8"):
        deltas.append(stream.add(b))
        if stream.stopped_by:
            break
    return deltas


def test_multibyte_characters_arrive_whole() -> None:
    stream = TextStream(build_byte_tokenizer())
    deltas = _feed(stream, "aé✓")
    assert deltas == ["a", "", "é", "", "", "✓"]
    assert stream.finish() == ""


def test_unfinished_character_flushed_at_the_end() -> None:
    stream = TextStream(build_byte_tokenizer())
    assert stream.add(0xE2) == ""
    assert stream.finish() == "\ufffd"


def test_stop_string_cut_and_never_streamed() -> None:
    stream = TextStream(build_byte_tokenizer(), stop=("STOP",))
    deltas = _feed(stream, "abcSTOPdef")
    assert stream.stopped_by == "STOP"
    assert "".join(deltas) + stream.finish() == "abc"


def test_stop_string_kept_when_asked() -> None:
    stream = TextStream(build_byte_tokenizer(), stop=("ST",), include_stop=True)
    deltas = _feed(stream, "xxSTyy")
    assert "".join(deltas) + stream.finish() == "xxST"


def test_held_back_prefix_released_when_not_a_stop() -> None:
    stream = TextStream(build_byte_tokenizer(), stop=("STOP",))
    deltas = _feed(stream, "aSTOx")
    assert stream.stopped_by is None
    assert "".join(deltas) + stream.finish() == "aSTOx"
    assert "".join(deltas) == "aS"  # "TOx" could still have begun a stop when last seen


def test_no_stop_check_before_min_tokens() -> None:
    stream = TextStream(build_byte_tokenizer(), stop=("a",))
    assert stream.add(ord("a"), check_stop=False) == "a"
    assert stream.stopped_by is None
    assert stream.add(ord("a")) == ""
    assert stream.stopped_by == "a"
    assert stream.finish() == ""
    assert stream.text == "a"
