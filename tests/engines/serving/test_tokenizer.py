"""The byte-level tokenizer made in code: exact round trips, specials, the chat template."""

from __future__ import annotations

from engines.serving.tokenizer import (
    BOS,
    EOS,
    IM_END,
    build_byte_tokenizer,
    generation_ids,
    stop_token_ids,
)


def test_bytes_round_trip_and_bos() -> None:
    tok = build_byte_tokenizer()
    text = "héllo, wörld ✓ \x00\n"
    ids = tok.encode(text)
    assert ids[0] == tok.convert_tokens_to_ids(BOS)
    assert ids[1:] == list(text.encode("utf-8"))
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))


def test_special_tokens_parse_and_skip() -> None:
    tok = build_byte_tokenizer()
    ids = tok.encode(f"a{IM_END}b<think>", add_special_tokens=False)
    assert ids == [97, tok.convert_tokens_to_ids(IM_END), 98, tok.convert_tokens_to_ids("<think>")]
    assert tok.decode(ids, skip_special_tokens=True) == "ab<think>"
    assert stop_token_ids(tok) == [
        tok.convert_tokens_to_ids(EOS),
        tok.convert_tokens_to_ids(IM_END),
    ]


def test_chat_template_thinking_switch() -> None:
    tok = build_byte_tokenizer()
    messages = [{"role": "user", "content": "hi"}]
    on = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    off = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert on == f"{BOS}<|im_start|>user\nhi{IM_END}\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_generation_ids_are_one_visible_character_each_or_a_stop() -> None:
    tok = build_byte_tokenizer()
    ids = generation_ids(tok)
    stops = set(stop_token_ids(tok))
    for i in ids:
        text = tok.decode([i], skip_special_tokens=True)
        assert (i in stops and text == "") or (
            len(text) == 1 and (text.isprintable() or text == "\n")
        )
