"""The byte-level tokenizer made in code, for `random:<name>` models (no download).

It is a real Hugging Face fast tokenizer (built with the `tokenizers` library), so the
engine has one tokenizer interface for random and pretrained models alike, and a random
model saved with `save_pretrained` loads back through the ordinary folder path. Ids 0-255
are the bytes; special tokens follow; the chat template has a thinking switch
(`enable_thinking`) like Qwen 3's.
"""

from __future__ import annotations

from typing import cast

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD = "<|pad|>"
BOS = "<|bos|>"
EOS = "<|eos|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Skipped when decoding output; the think markers stay visible, as in Qwen 3's tokenizer.
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START, IM_END)
VISIBLE_ADDED_TOKENS = (THINK_OPEN, THINK_CLOSE)
BYTE_VOCAB_SIZE = 256

# Thinking is on unless `enable_thinking` is false, in which case the template closes an
# empty think block so the model answers directly (the convention of Qwen 3 templates).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n"
    "{% endif %}"
    "{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (ByteLevel's alphabet)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, codes), strict=True))


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per byte, BOS/EOS/PAD, chat markers, chat template.

    No merges, so every byte is its own token and any text round-trips exactly.
    """
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(BYTE_VOCAB_SIZE)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in VISIBLE_ADDED_TOKENS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, bos_id)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, model_max_length=1 << 20
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def generation_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The ids a random model may generate: printable ASCII, newline, and the stop ids.

    A random model's choice among bytes is arbitrary, and bytes 0x80-0xFF rarely form
    valid UTF-8: their text would be held back until a character completes, and streams
    would carry one chunk for many tokens. With these ids every generated token is one
    visible character (or a stop), so streamed chunks match tokens one to one, as for a
    real model's ordinary tokens, and timing between chunks means what it says.
    """
    return [ord("\n"), *range(0x20, 0x7F), *stop_token_ids(tokenizer)]


def stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """The ids that end a generation for the byte tokenizer: EOS and the end-of-turn marker."""
    # One token in, one id out: the stub's `int | list[int]` covers a list argument.
    return [cast(int, tokenizer.convert_tokens_to_ids(token)) for token in (EOS, IM_END)]
