"""Real text for sweep prompts: GSM8K questions, BFCL questions or a user's JSONL file.

Speculative decoding gains with how predictable the text is, and shuffled filler words are
the least predictable text there is, so sweeps can draw their prompts from real text
instead (`--prompts gsm8k|bfcl|jsonl:PATH`). This module owns where that text comes from
and how many tokens a word of it costs on the server under test; `PromptFactory` still puts
the nonce first and cuts each prompt to its exact length.

A source is its items' words in order; each prompt starts at a point chosen by its nonce
and reads on (wrapping round), so prompts differ from their first word after the nonce as
well as in it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from agent.evals.gsm8k import GSM8K_TEST_SHA256, fetch_gsm8k, load_gsm8k
from agent.evals.task import DataError
from agent.loadgen.client import ChatRequest, OpenAIClient
from contract.suite import PromptCalibration

__all__ = ["TextSource", "calibrate_source", "load_source"]

log = logging.getLogger(__name__)

_JSONL_KEYS = ("text", "prompt", "question", "content")
_CALIBRATION_WORDS = 300
# Fewer words than this would make even short prompts repeat within themselves.
_MIN_WORDS = 50
DEFAULT_DATA_DIR = Path.home() / ".cache" / "llm-serving-bench" / "data"


@dataclass(frozen=True, slots=True)
class TextSource:
    """Words of real text in reading order, and where they came from."""

    name: str
    words: tuple[str, ...]
    sha256: str

    def words_for(self, nonce: str, count: int) -> list[str]:
        """`count` words read on from a start point chosen by `nonce`, wrapping round."""
        start = random.Random(nonce).randrange(len(self.words))
        n = len(self.words)
        return [self.words[(start + i) % n] for i in range(count)]


def _from_texts(name: str, texts: list[str]) -> TextSource:
    words = tuple(word for text in texts for word in text.split())
    if len(words) < _MIN_WORDS:
        raise DataError(f"prompt source {name} holds {len(words)} words; at least {_MIN_WORDS}")
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    return TextSource(name=name, words=words, sha256=digest)


def _jsonl_texts(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"prompt source {path} does not exist")
    texts: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{number}: not JSON ({exc})") from exc
            if isinstance(row, str):
                texts.append(row)
                continue
            text = next((row[k] for k in _JSONL_KEYS if isinstance(row, dict) and k in row), None)
            if not isinstance(text, str):
                raise DataError(
                    f"{path}:{number}: expected a string or an object with one of "
                    f"{', '.join(_JSONL_KEYS)}"
                )
            texts.append(text)
    return texts


def _bfcl_texts() -> list[str]:
    from agent.evals.bfcl import load_bfcl

    return [
        str(message.get("content", ""))
        for item in load_bfcl()
        for message in item.messages
        if message.get("role") == "user"
    ]


def load_source(
    spec: str, *, gsm8k_data: Path | None = None, data_dir: Path | None = None
) -> TextSource | None:
    """The text behind `--prompts` (None for synthetic); DataError names what is wrong."""
    if spec == "synthetic":
        return None
    if spec == "gsm8k":
        if gsm8k_data is None:
            gsm8k_data = fetch_gsm8k((data_dir or DEFAULT_DATA_DIR) / "gsm8k-test.jsonl")
        items = load_gsm8k(gsm8k_data, sha256=GSM8K_TEST_SHA256)
        return _from_texts("gsm8k", [item.question for item in items])
    if spec == "bfcl":
        return _from_texts("bfcl", _bfcl_texts())
    if spec.startswith("jsonl:"):
        path = Path(spec.removeprefix("jsonl:")).expanduser()
        return _from_texts(f"jsonl:{path}", _jsonl_texts(path))
    raise DataError(f"prompts {spec!r}: expected synthetic, gsm8k, bfcl or jsonl:PATH")


async def calibrate_source(
    client: OpenAIClient, calibration: PromptCalibration, source: TextSource | None
) -> PromptCalibration:
    """The calibration with tokens per word measured on `source`'s words, not the filler's.

    With a tokenize endpoint the words are counted; without one a real one-token request
    is sent and the chat template's known overhead taken off its `usage.prompt_tokens`.
    """
    if source is None:
        return calibration
    calibration = calibration.model_copy(
        update={"text_source": source.name, "text_sha256": source.sha256}
    )
    words = source.words_for("calibration", _CALIBRATION_WORDS)
    text = " ".join(words)
    tokens: int | None = None
    if calibration.tokenize_endpoint:
        tokens = await client.tokenize_raw(text)
    else:
        record = await client.send(
            ChatRequest(
                prompt=text, max_tokens=1, label="calibration", request_id="calibration-source"
            )
        )
        if record.prompt_tokens is not None:
            tokens = record.prompt_tokens - calibration.template_overhead_tokens
    if not tokens:
        log.warning("could not measure tokens per word of %s; using the filler's", source.name)
        return calibration
    per_word = max(0.2, tokens / len(words))
    log.info("prompt source %s: %.3f tokens/word", source.name, per_word)
    return calibration.model_copy(update={"tokens_per_word": per_word})
