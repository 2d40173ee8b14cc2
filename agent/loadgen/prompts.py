"""Prompts of an exact token length, each unique from its first token.

Prefix caches key on the head of the prompt, so the per-request nonce comes FIRST (seed 002:
a trailing nonce let vLLM serve 94.7% of a sweep from its prefix cache). The nonce is a
run-unique counter spelt as words, followed by filler words shuffled by that counter (or,
with a real-text source, the source's words read from a point chosen by it), so no two
prompts of a run share even their first token's neighbourhood.

Exact length: where the server has a tokenize endpoint, each prompt is measured and trimmed
or padded until its raw token count plus the chat template's overhead equals the target;
elsewhere the count is estimated from a calibration and the real one is recorded from
`usage.prompt_tokens` on every request.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.loadgen.text_sources import TextSource
from contract.suite import PromptCalibration

__all__ = ["NONCE_POOL", "WORDS", "Prompt", "PromptFactory", "calibrate"]

log = logging.getLogger(__name__)

# Common English words; most tokenizers keep each (with its leading space) as one token.
WORDS = tuple(
    [
        "time",
        "year",
        "people",
        "way",
        "day",
        "man",
        "thing",
        "woman",
        "life",
        "child",
        "world",
        "school",
        "state",
        "family",
        "student",
        "group",
        "country",
        "problem",
        "hand",
        "part",
        "place",
        "case",
        "week",
        "company",
        "system",
        "program",
        "question",
        "work",
        "government",
        "number",
        "night",
        "point",
        "home",
        "water",
        "room",
        "mother",
        "area",
        "money",
        "story",
        "fact",
        "month",
        "lot",
        "right",
        "study",
        "book",
        "eye",
        "job",
        "word",
        "business",
        "issue",
        "side",
        "kind",
        "head",
        "house",
        "service",
        "friend",
        "father",
        "power",
        "hour",
        "game",
        "line",
        "end",
        "member",
        "law",
        "car",
        "city",
        "community",
        "name",
        "president",
        "team",
        "minute",
        "idea",
        "kid",
        "body",
        "information",
        "back",
        "parent",
        "face",
        "others",
        "level",
        "office",
        "door",
        "health",
        "person",
        "art",
        "war",
        "history",
        "party",
        "result",
        "change",
        "morning",
        "reason",
        "research",
        "girl",
        "guy",
        "moment",
        "air",
        "teacher",
        "force",
        "education",
        "foot",
        "boy",
        "age",
        "policy",
        "process",
        "music",
        "market",
        "sense",
        "nation",
        "plan",
        "college",
        "interest",
        "death",
        "experience",
        "effect",
        "use",
        "class",
        "control",
        "care",
        "field",
        "development",
        "role",
        "effort",
        "rate",
        "heart",
        "drug",
        "show",
        "leader",
        "light",
        "voice",
        "wife",
        "police",
        "mind",
        "price",
        "report",
        "decision",
        "son",
        "view",
        "relationship",
        "town",
        "road",
        "arm",
        "difference",
        "value",
        "building",
        "action",
        "model",
        "season",
        "society",
        "tax",
        "director",
        "position",
        "player",
        "record",
        "paper",
        "space",
        "ground",
        "form",
        "event",
        "official",
        "matter",
        "center",
        "couple",
        "site",
        "project",
        "activity",
        "star",
        "table",
        "need",
        "court",
        "oil",
        "situation",
        "cost",
        "industry",
        "figure",
        "street",
        "image",
        "phone",
        "data",
        "picture",
        "practice",
        "piece",
        "land",
        "product",
        "doctor",
        "wall",
        "patient",
        "worker",
        "news",
        "test",
        "movie",
        "north",
        "love",
        "support",
        "technology",
        "step",
        "baby",
        "computer",
        "type",
        "attention",
        "film",
        "tree",
        "source",
        "organization",
        "hair",
        "window",
        "evidence",
        "population",
        "truth",
        "song",
        "ball",
        "bank",
        "river",
        "garden",
    ]
)
_NONCE_WORDS = 4
# The nonce is the one part of a prompt that cannot shrink, so it is spelt with short
# words only: at most 28 characters, which leaves a 48-token chat prompt room to fit
# under a byte-level tokenizer (whole words of WORDS would take up to 52). 168 words,
# 168^4 distinct nonces.
NONCE_POOL = tuple(w for w in WORDS if len(w) <= 6)
_MAX_ADJUSTMENTS = 24
# Tried in order to add one or two tokens; which one adds exactly one depends on the tokenizer.
_PAD_SUFFIXES = (" x", ".", " .")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    nonce: str
    raw_tokens: int | None
    target_tokens: int

    @property
    def exact(self) -> bool:
        return self.raw_tokens is not None


TokenCounter = Callable[[str], Awaitable[int | None]]


class PromptFactory:
    """Builds unique prompts for one run; the counter never repeats within a run."""

    def __init__(
        self,
        calibration: PromptCalibration,
        count_tokens: TokenCounter | None,
        *,
        run_offset: int | None = None,
        concurrency: int = 8,
        source: TextSource | None = None,
    ) -> None:
        self.calibration = calibration
        self.source = source
        self._count = count_tokens if calibration.tokenize_endpoint else None
        self._next = run_offset if run_offset is not None else secrets.randbelow(1 << 40)
        self._limit = asyncio.Semaphore(concurrency)

    def _nonce(self, counter: int) -> str:
        words = []
        for _ in range(_NONCE_WORDS):
            counter, digit = divmod(counter, len(NONCE_POOL))
            words.append(NONCE_POOL[digit])
        return "-".join(words) + ":"

    def _words(self, nonce: str, count: int) -> str:
        if self.source is not None:
            return " ".join(self.source.words_for(nonce, count))
        rng = random.Random(nonce)
        return " ".join(rng.choice(WORDS) for _ in range(count))

    async def build(self, n: int, target_tokens: int) -> list[Prompt]:
        """n unique prompts whose prompt_tokens (template included) should be `target_tokens`."""
        counters = range(self._next, self._next + n)
        self._next += n
        return list(await asyncio.gather(*(self._one(c, target_tokens) for c in counters)))

    async def _one(self, counter: int, target_tokens: int) -> Prompt:
        nonce = self._nonce(counter)
        raw_target = max(1, target_tokens - self.calibration.template_overhead_tokens)
        words = max(0, round(raw_target / self.calibration.tokens_per_word) - _NONCE_WORDS - 1)
        text = f"{nonce} {self._words(nonce, words)}".rstrip()
        if self._count is None:
            return Prompt(text=text, nonce=nonce, raw_tokens=None, target_tokens=target_tokens)
        async with self._limit:
            text, raw = await self._fit(nonce, words, raw_target)
        return Prompt(text=text, nonce=nonce, raw_tokens=raw, target_tokens=target_tokens)

    async def _fit(self, nonce: str, words: int, raw_target: int) -> tuple[str, int | None]:
        """Word count first (coarse), then single characters (fine), bounded in calls."""
        assert self._count is not None
        filler = self._words(nonce, words + raw_target).split()
        count: int | None = None
        text = nonce
        for _ in range(_MAX_ADJUSTMENTS // 2):
            text = " ".join([nonce, *filler[:words]])
            count = await self._count(text)
            if count is None or count == raw_target:
                return text, count
            step = round((raw_target - count) / self.calibration.tokens_per_word)
            if step == 0 or (count < raw_target and step < 0):
                break
            words = max(0, words + step)
        while count is not None and count > raw_target and words > 0:
            words -= 1
            text = " ".join([nonce, *filler[:words]])
            count = await self._count(text)
        for _ in range(_MAX_ADJUSTMENTS):
            if count is None or count >= raw_target:
                break
            for suffix in _PAD_SUFFIXES:
                padded = await self._count(text + suffix)
                if padded is not None and count < padded <= raw_target:
                    text, count = text + suffix, padded
                    break
            else:
                break
        if count != raw_target:
            log.debug("prompt %s: %s raw tokens for a target of %d", nonce, count, raw_target)
        return text, count


_DEFAULT_TOKENS_PER_WORD = 1.3


async def calibrate(client: OpenAIClient) -> PromptCalibration:
    """Learn the server's tokens per filler word and its chat template's overhead.

    With a tokenize endpoint: one tokenize call and one real one-token request. Without:
    two real requests of different lengths, solved for slope and intercept.
    """
    short_words, long_words = 40, 160
    short = "Record calibration. " + " ".join(WORDS[:short_words])
    long = "Record calibration. " + " ".join((WORDS * 2)[:long_words])
    endpoint = None
    raw_short = await client.tokenize_raw(short)
    raw_long = await client.tokenize_raw(long) if raw_short else None
    if raw_short and raw_long:
        endpoint = "/tokenize"
        tokens_per_word = (raw_long - raw_short) / (long_words - short_words)
    record = await client.send(
        ChatRequest(prompt=short, max_tokens=1, label="calibration", request_id="calibration-1")
    )
    if record.error or record.prompt_tokens is None:
        log.warning(
            "calibration request gave no usage.prompt_tokens (%s); prompt lengths are estimates",
            record.error or "no usage",
        )
        return PromptCalibration(
            tokenize_endpoint=endpoint,
            template_overhead_tokens=0,
            tokens_per_word=tokens_per_word if endpoint else _DEFAULT_TOKENS_PER_WORD,
        )
    if endpoint and raw_short:
        overhead = record.prompt_tokens - raw_short
    else:
        second = await client.send(
            ChatRequest(prompt=long, max_tokens=1, label="calibration", request_id="calibration-2")
        )
        if second.prompt_tokens is None:
            tokens_per_word = _DEFAULT_TOKENS_PER_WORD
        else:
            tokens_per_word = (second.prompt_tokens - record.prompt_tokens) / (
                long_words - short_words
            )
        overhead = round(record.prompt_tokens - tokens_per_word * (short_words + 2))
    return PromptCalibration(
        tokenize_endpoint=endpoint,
        template_overhead_tokens=max(0, overhead),
        tokens_per_word=max(0.2, tokens_per_word),
    )
