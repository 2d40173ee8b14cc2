"""GSM8K: the test split pinned by sha256, the prompts, and lm-evaluation-harness's scoring.

Owns everything GSM8K-specific: fetching the test split at run time (a URL and a sha256
pin; `--data PATH` reads a local copy instead), the zero-shot chat prompt and lm-eval's
few-shot formats, and both of lm-eval's filters with its normalisation:

- strict-match: `#### (\\-?[0-9\\.\\,]+)`, the first match (gsm8k_cot: `The answer is N.`);
- flexible-extract: `(-?[$0-9.,]{2,})|(-?[0-9]+)`, the last match (group_select -1);
- both then drop ',', '$', everything up to '#### ' and one trailing '.', and lower-case.

lm-eval then compares strings; we compare the normalised answers as numbers, so `1200.00`
and `1200` agree (lm-eval's string verdict is kept beside it as `string_match`).
Flexible-extract is the headline: chat models rarely write `#### N` unasked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path

import httpx

from agent.evals.task import DataError, Prepared, Question, Reply, Scored
from contract.evals import EvalName, FilterResult, GSM8KPrompt, GSM8KScore, GSM8KSettings
from contract.files import sha256_file

__all__ = [
    "GSM8K_TEST_QUESTIONS",
    "GSM8K_TEST_SHA256",
    "GSM8K_TEST_URL",
    "GSM8KItem",
    "GSM8KTask",
    "fetch_gsm8k",
    "flexible_extract",
    "lm_eval_normalise",
    "load_gsm8k",
    "score_reply",
    "sha256_file",
    "strict_match",
]

log = logging.getLogger(__name__)

# openai/grade-school-math at a fixed commit: the file shared/data/gsm8k/ carries, byte for byte.
GSM8K_TEST_URL = (
    "https://raw.githubusercontent.com/openai/grade-school-math/"
    "3101c7d5072418e28b9008a6636bde82a006892c/grade_school_math/data/test.jsonl"
)
GSM8K_TEST_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
GSM8K_TEST_QUESTIONS = 1319
_MAX_DOWNLOAD_BYTES = 16 * 1024 * 1024  # the test split is 0.75 MB; anything far larger is wrong

# lm-eval gsm8k v3 / gsm8k_cot v3 (lm_eval/tasks/gsm8k/*.yaml).
STRICT_PATTERN = re.compile(r"#### (\-?[0-9\.\,]+)")
COT_STRICT_PATTERN = re.compile(r"The answer is (\-?[0-9\.\,]+).")
FLEXIBLE_PATTERN = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")

ZERO_SHOT_TEMPLATE = (
    "Solve this math word problem. Think step by step, then end your reply with the final "
    'answer, a number only, on its own line as "#### <number>".\n\n{question}'
)
_FEWSHOT_STOP = {
    "lm-eval-5shot": ["Question:", "</s>", "<|im_end|>"],
    "lm-eval-cot-8shot": ["Q:", "</s>", "<|im_end|>"],
}
# gsm8k_cot's fixed exemplars (Wei et al. 2022, as lm-eval's gsm8k-cot.yaml carries them, MIT).
COT_EXEMPLARS: tuple[tuple[str, str], ...] = (
    (
        "There are 15 trees in the grove. Grove workers will plant trees in the grove today. "
        "After they are done, there will be 21 trees. How many trees did the grove workers "
        "plant today?",
        "There are 15 trees originally. Then there were 21 trees after some more were planted. "
        "So there must have been 21 - 15 = 6. The answer is 6.",
    ),
    (
        "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in "
        "the parking lot?",
        "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    ),
    (
        "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they "
        "have left in total?",
        "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = "
        "74. After eating 35, they had 74 - 35 = 39. The answer is 39.",
    ),
    (
        "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How "
        "many lollipops did Jason give to Denny?",
        "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave "
        "Denny 20 - 12 = 8. The answer is 8.",
    ),
    (
        "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How "
        "many toys does he have now?",
        "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 "
        "more toys. 5 + 4 = 9. The answer is 9.",
    ),
    (
        "There were nine computers in the server room. Five more computers were installed each "
        "day, from monday to thursday. How many computers are now in the server room?",
        "There were originally 9 computers. For each of 4 days, 5 more computers were added. So "
        "5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29.",
    ),
    (
        "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 "
        "more. How many golf balls did he have at the end of wednesday?",
        "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. "
        "After losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    ),
    (
        "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
        "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she "
        "has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8.",
    ),
)


@dataclass(frozen=True, slots=True)
class GSM8KItem(Question):
    question: str
    answer: str = ""
    target: str = ""


# --- data ---


def load_gsm8k(path: Path, *, sha256: str | None = GSM8K_TEST_SHA256) -> list[GSM8KItem]:
    """Read a GSM8K jsonl split; with `sha256` set, refuse a file that is not that one."""
    if not path.is_file():
        raise DataError(f"GSM8K data {path} does not exist")
    if sha256 is not None:
        actual = sha256_file(path)
        if actual != sha256:
            raise DataError(f"GSM8K data {path} has sha256 {actual}, expected {sha256}")
    items: list[GSM8KItem] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                question, answer = row["question"], row["answer"]
            except (ValueError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{number}: not a GSM8K row ({exc})") from exc
            if "#### " not in answer:
                raise DataError(f"{path}:{number}: the answer has no '#### N' line")
            index = len(items)
            items.append(
                GSM8KItem(
                    index=index,
                    question_id=f"gsm8k-{index}",
                    question=question,
                    answer=answer,
                    target=lm_eval_normalise(answer),
                )
            )
    if not items:
        raise DataError(f"GSM8K data {path} holds no questions")
    return items


def fetch_gsm8k(
    dest: Path,
    *,
    url: str = GSM8K_TEST_URL,
    sha256: str = GSM8K_TEST_SHA256,
    timeout_s: float = 60.0,
) -> Path:
    """Download the split to `dest` unless a copy with the right sha256 is already there.

    The bytes go to a temporary file first and replace `dest` only once their sha256 matches,
    so a failed or altered download never leaves a file that looks usable.
    """
    if dest.is_file() and sha256_file(dest) == sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    size = 0
    try:
        with (
            httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as response,
            tmp.open("wb") as handle,
        ):
            if response.status_code != 200:
                raise DataError(f"GSM8K download {url} answered HTTP {response.status_code}")
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > _MAX_DOWNLOAD_BYTES:
                    raise DataError(f"GSM8K download {url} is larger than expected")
                digest.update(chunk)
                handle.write(chunk)
    except httpx.HTTPError as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"GSM8K download {url} failed: {exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise DataError(f"GSM8K download {url} has sha256 {digest.hexdigest()}, expected {sha256}")
    tmp.replace(dest)
    log.info("fetched GSM8K test split (%d bytes) to %s", size, dest)
    return dest


# --- scoring ---


def lm_eval_normalise(text: str) -> str:
    """lm-eval's exact_match normalisation for gsm8k: regexes_to_ignore, then ignore_case."""
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.lower().strip()


def _take(pattern: re.Pattern[str], reply: str, group_select: int) -> str | None:
    """lm-eval's RegexFilter: findall, pick one match, first non-empty group of a tuple."""
    matches = pattern.findall(reply)
    if not matches:
        return None
    match = matches[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), "")
    return str(match).strip()


def strict_match(reply: str, prompt: GSM8KPrompt = "zero-shot") -> str | None:
    pattern = COT_STRICT_PATTERN if prompt == "lm-eval-cot-8shot" else STRICT_PATTERN
    return _take(pattern, reply, 0)


def flexible_extract(reply: str) -> str | None:
    return _take(FLEXIBLE_PATTERN, reply, -1)


def _as_number(text: str) -> Decimal | None:
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def _judge(extracted: str | None, target: str, missing: str) -> FilterResult:
    if extracted is None:
        return FilterResult(extracted=None, correct=False, reason=missing)
    normalised = lm_eval_normalise(extracted)
    string_match = normalised == target
    value, expected = _as_number(normalised), _as_number(target)
    if value is None:
        reason = f"{extracted!r} is not a number"
        return FilterResult(
            extracted=extracted,
            normalised=normalised,
            correct=False,
            string_match=string_match,
            reason=reason,
        )
    correct = expected is not None and value == expected
    return FilterResult(
        extracted=extracted,
        normalised=normalised,
        correct=correct,
        string_match=string_match,
        reason=f"{normalised} {'=' if correct else '!='} {target}",
    )


def score_reply(reply: str, target: str, prompt: GSM8KPrompt = "zero-shot") -> GSM8KScore:
    """Both lm-eval filters on one reply against the normalised target number."""
    if not reply.strip():
        empty = FilterResult(extracted=None, correct=False, reason="empty reply")
        return GSM8KScore(target=target, strict_match=empty, flexible_extract=empty)
    strict_missing = (
        "no 'The answer is N' in the reply"
        if prompt == "lm-eval-cot-8shot"
        else "no '#### N' in the reply"
    )
    return GSM8KScore(
        target=target,
        strict_match=_judge(strict_match(reply, prompt), target, strict_missing),
        flexible_extract=_judge(flexible_extract(reply), target, "no number in the reply"),
    )


# --- prompts ---


def _fewshot_5shot_contexts(
    items: Sequence[GSM8KItem], train: Sequence[GSM8KItem], seed: int
) -> list[str]:
    """lm-eval's default sampler: one random.Random(seed), 5 train docs drawn per test doc in
    order, each shown as 'Question: q\\nAnswer: <full answer>' and joined by blank lines."""
    rnd = random.Random(seed)
    population = list(train)
    contexts = []
    for _ in items:
        shots = rnd.sample(population, 5)
        contexts.append("".join(f"Question: {s.question}\nAnswer: {s.answer}\n\n" for s in shots))
    return contexts


_COT_CONTEXT = "".join(f"Q: {q}\nA: {a}\n\n" for q, a in COT_EXEMPLARS)


class GSM8KTask:
    """GSM8K, loaded and checked, ready for the runner."""

    name: EvalName = "gsm8k"
    headline = "flexible-extract"
    mark_names = ("flexible-extract", "strict-match")

    def __init__(
        self,
        settings: GSM8KSettings,
        items: Sequence[GSM8KItem],
        *,
        data_label: str,
        data_sha256: str | None,
        train: Sequence[GSM8KItem] | None = None,
    ) -> None:
        self.settings = settings
        self._items = list(items)[: settings.limit] if settings.limit else list(items)
        self.data_label = data_label
        self.data_sha256 = data_sha256
        self.prompt_label = settings.prompt
        self.checker_label = (
            "lm-evaluation-harness gsm8k filters (strict-match, flexible-extract), "
            "normalised answers compared as numbers"
        )
        self._contexts: list[str] | None = None
        if settings.prompt == "lm-eval-5shot":
            if not train or len(train) < 5:
                raise DataError(
                    "prompt 'lm-eval-5shot' needs the GSM8K train split (5 exemplars per "
                    "question are drawn from it, as lm-eval does)"
                )
            self._contexts = _fewshot_5shot_contexts(self._items, train, settings.fewshot_seed)

    @classmethod
    def from_file(
        cls,
        settings: GSM8KSettings,
        path: Path,
        *,
        sha256: str | None = GSM8K_TEST_SHA256,
        train_path: Path | None = None,
    ) -> GSM8KTask:
        items = load_gsm8k(path, sha256=sha256)
        train = load_gsm8k(train_path, sha256=None) if train_path else None
        return cls(
            settings, items, data_label=str(path), data_sha256=sha256_file(path), train=train
        )

    def questions(self) -> Sequence[GSM8KItem]:
        return self._items

    def _text(self, item: GSM8KItem) -> str:
        if self.settings.prompt == "lm-eval-cot-8shot":
            return f"{_COT_CONTEXT}Q: {item.question}\nA:"
        if self._contexts is not None:
            return f"{self._contexts[item.index]}Question: {item.question}\nAnswer:"
        return ZERO_SHOT_TEMPLATE.format(question=item.question)

    def prepare(self, question: GSM8KItem) -> Prepared:
        text = self._text(question)
        stop = _FEWSHOT_STOP.get(self.settings.prompt)
        if self.settings.request.endpoint == "completions":
            return Prepared(prompt=text, stop=stop)
        # Few-shot over chat is lm-eval's --apply_chat_template: the whole context, one turn.
        return Prepared(messages=[{"role": "user", "content": text}], stop=stop)

    def score(self, question: GSM8KItem, reply: Reply) -> Scored:
        result = score_reply(reply.content, question.target, self.settings.prompt)
        flexible, strict = result.flexible_extract, result.strict_match
        return Scored(
            extracted=flexible.normalised,
            correct=flexible.correct,
            reason=f"flexible-extract: {flexible.reason}; strict-match: {strict.reason}",
            marks={"flexible-extract": flexible.correct, "strict-match": strict.correct},
            gsm8k=result,
        )
