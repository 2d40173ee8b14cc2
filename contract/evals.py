"""Answer-quality evals: their settings, the per-question records, the summary and the comparison.

An eval job folder holds `answers.jsonl` (one `AnswerRecord` per question, appended as each
answer is scored) and `summary.json` (an `EvalSummary`, replaced after every answer), so a
lost instance loses at most the question in flight. `bench report` reads these, and
`contract.paired` turns two or more runs into a `Comparison`.

A failed request, an empty, cut-off or unparseable reply is data: it is an `AnswerRecord`
scored wrong with its reason, never an exception.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from contract.errors import BenchError
from contract.frozen import FrozenModel
from contract.suite import RequestSettings

__all__ = [
    "ANSWERS_FILE",
    "BFCL_EVAL_VERSION",
    "AnswerRecord",
    "BFCLMode",
    "BFCLScore",
    "BFCLSettings",
    "Comparison",
    "DataError",
    "EvalName",
    "EvalSummary",
    "FilterResult",
    "GSM8KPrompt",
    "GSM8KScore",
    "GSM8KSettings",
    "MarkCount",
    "NoiseFloor",
    "RunSide",
    "ToolCall",
    "Verdict",
]


class DataError(BenchError, ValueError):
    """Eval data is missing, altered or unreadable: one clear line."""

ANSWERS_FILE = "answers.jsonl"
# The bfcl-eval release whose questions, possible answers and AST checker we score with.
# The data and the checker ship together, so the version is part of every BFCL result.
BFCL_EVAL_VERSION = "2026.3.23"

EvalName = Literal["gsm8k", "bfcl_simple"]
GSM8KPrompt = Literal["zero-shot", "lm-eval-5shot", "lm-eval-cot-8shot"]
BFCLMode = Literal["tools", "prompt"]
Verdict = Literal["level", "better", "worse"]


class _Settings(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


def _eval_request() -> RequestSettings:
    # Answers must end where the model ends them: no forced output length, greedy, no thinking.
    return RequestSettings(force_output="none", thinking=False, temperature=0.0)


class _EvalSettings(_Settings):
    limit: int | None = Field(
        None, ge=1, description="ask only the first N questions (smoke runs); None = all"
    )
    request: RequestSettings = Field(default_factory=_eval_request)
    concurrency: int = Field(
        1, ge=1, le=256, description="questions in flight at once (1, as the seeds asked them)"
    )

    @field_validator("request", mode="before")
    @classmethod
    def _no_forced_output_unless_said(cls, value: object) -> object:
        # RequestSettings defaults to forcing the output length (right for the sweep, wrong
        # here): a spec that leaves force_output out means "none" for an eval.
        if isinstance(value, dict) and "force_output" not in value:
            return {**value, "force_output": "none"}
        return value

    @model_validator(mode="after")
    def _no_forced_output(self) -> _EvalSettings:
        if self.request.force_output != "none":
            raise ValueError(
                "request.force_output must be 'none' for evals: a forced length changes answers"
            )
        return self


class GSM8KSettings(_EvalSettings):
    """GSM8K test split: how it is asked and how long an answer may be."""

    max_tokens: int = Field(2048, ge=16, le=131072)
    prompt: GSM8KPrompt = Field(
        "zero-shot",
        description="zero-shot chat with the '#### N' instruction, or lm-eval's gsm8k "
        "(5-shot, exemplars from the train split) or gsm8k_cot (8 fixed exemplars) format",
    )
    fewshot_seed: int = Field(1234, description="lm-eval's default few-shot sampler seed")


class BFCLSettings(_EvalSettings):
    """BFCL simple (Python): native tool calls or the prompt format, and the answer cap."""

    max_tokens: int = Field(512, ge=16, le=131072)
    mode: BFCLMode = Field("tools", description="OpenAI `tools` (native) or BFCL's prompt mode")
    category: Literal["simple_python"] = "simple_python"

    @model_validator(mode="after")
    def _chat_only(self) -> BFCLSettings:
        if self.request.endpoint != "chat":
            raise ValueError("request.endpoint must be 'chat' for BFCL (tools need messages)")
        return self


class _Record(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


class FilterResult(_Record):
    """One lm-eval filter (strict-match or flexible-extract) applied to one reply."""

    extracted: str | None = Field(
        description="what the filter's regex took; None where lm-eval gives '[invalid]'"
    )
    normalised: str | None = Field(
        None, description="after lm-eval's regexes_to_ignore (',', '$', '.*#### ', '\\.$')"
    )
    correct: bool = Field(description="normalised answer equals the target as a number")
    string_match: bool = Field(
        False, description="lm-eval's own exact_match (string equality after normalising)"
    )
    reason: str


class GSM8KScore(_Record):
    target: str = Field(description="the reference's number after '#### ', normalised")
    strict_match: FilterResult
    flexible_extract: FilterResult


class ToolCall(_Record):
    """A tool call as the server returned it: arguments are the raw JSON string."""

    name: str
    arguments: str


class BFCLScore(_Record):
    decoded: list[dict[str, Any]] | None = Field(
        None, description="the calls as the checker saw them: [{name: {param: value}}]"
    )
    error_type: str | None = Field(
        None, description="checker or decoder error type, e.g. 'simple_function_checker:...'"
    )
    errors: list[str] = Field(default_factory=list)


class AnswerRecord(_Record):
    """One question, asked once: one line of `answers.jsonl`."""

    eval: EvalName
    index: int = Field(description="position in the data set (0-based)")
    question_id: str
    reply: str = Field("", description="message content (empty when there was none)")
    reasoning: str | None = Field(None, description="reasoning content, if the server sent any")
    tool_calls: list[ToolCall] = Field(default_factory=list)
    extracted: str | None = Field(
        None, description="the headline answer taken from the reply (GSM8K: flexible-extract)"
    )
    correct: bool = Field(description="by the headline mark")
    reason: str = Field(description="why it is right or wrong, one line")
    marks: dict[str, bool] = Field(
        description="every scoring rule's verdict, e.g. {'flexible-extract': True, ...}"
    )
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float | None = Field(None, description="request sent -> whole reply received")
    finish_reason: str | None = None
    truncated: bool = Field(description="the reply hit the token cap")
    http_status: int | None = None
    error: str | None = Field(None, description="the request failed: why")
    gsm8k: GSM8KScore | None = None
    bfcl: BFCLScore | None = None


class MarkCount(_Record):
    correct: int
    n: int
    score: float | None


class EvalSummary(_Record):
    """`summary.json` of one eval job, rewritten after every answer."""

    kind: Literal["eval"] = "eval"
    eval: EvalName
    base_url: str
    model: str
    settings: GSM8KSettings | BFCLSettings
    prompt: str = Field(description="how it was asked, e.g. 'zero-shot' or 'tools'")
    data: str = Field(description="where the questions came from, e.g. a file or package")
    data_sha256: str | None = None
    checker: str = Field(description="how answers were scored, with versions")
    headline: str = Field(description="the mark `correct` and `score` use")
    questions: int = Field(description="questions to ask in this run")
    answered: int = Field(description="questions asked, answered (or failed) and scored")
    correct: int
    score: float | None = Field(description="correct / answered by the headline mark")
    marks: dict[str, MarkCount]
    truncated: int = Field(description="replies that hit the token cap")
    failed: int = Field(description="requests that failed (scored wrong)")
    completion_tokens: int
    started_unix_s: float
    finished_unix_s: float | None = None
    wall_s: float = Field(description="time from the first request to the last answer so far")
    complete: bool = Field(description="every question was asked and scored")
    errors: list[str] = Field(default_factory=list, description="first few distinct errors")


class RunSide(_Record):
    """One run in a comparison."""

    label: str
    score: float | None = Field(description="over the paired questions")
    correct: int
    n: int
    wall_s: float | None = Field(description="time to finish the eval")


class NoiseFloor(_Record):
    """Two runs of the same arm: how far apart repeated runs land (the run-to-run range)."""

    labels: tuple[str, str]
    scores: tuple[float | None, float | None]
    difference: float | None = Field(description="second minus first, over paired questions")
    range: float | None = Field(description="|difference|: the noise floor for a comparison")
    flipped: int = Field(description="questions marked differently by the two runs")
    n: int


class Comparison(_Record):
    """A candidate run against a named baseline run, paired question by question."""

    eval: EvalName
    mark: str = Field(description="which mark was compared, e.g. 'flexible-extract'")
    baseline: RunSide
    candidate: RunSide
    paired: int = Field(description="questions answered in both runs")
    unpaired: int = Field(description="questions in only one run (left out of the statistics)")
    difference: float | None = Field(description="candidate score minus baseline score")
    flipped_to_correct: list[str] = Field(description="wrong in the baseline, right in candidate")
    flipped_to_wrong: list[str] = Field(description="right in the baseline, wrong in candidate")
    mcnemar_p: float = Field(description="exact McNemar: two-sided binomial test on the flips")
    ci_low: float | None
    ci_high: float | None
    ci_level: float = 0.95
    ci_method: str
    verdict: Verdict = Field(description="'level' when the interval contains zero")
    time_ratio: float | None = Field(description="candidate wall time / baseline wall time")
    noise: NoiseFloor | None = None
