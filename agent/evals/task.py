"""What the eval runner needs from an eval: its questions, the request for each, and a scorer.

GSM8K and BFCL each implement `EvalTask`; the runner asks, times and records, and never
looks at which eval it runs. The types here are the seam between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from contract.evals import (
    BFCLScore,
    BFCLSettings,
    DataError,
    EvalName,
    GSM8KScore,
    GSM8KSettings,
    ToolCall,
)

__all__ = ["DataError", "EvalTask", "Prepared", "Question", "Reply", "Scored"]


@dataclass(frozen=True, slots=True)
class Question:
    index: int
    question_id: str


Q = TypeVar("Q", bound=Question)
Q_contra = TypeVar("Q_contra", bound=Question, contravariant=True)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to send for one question, independent of the wire format.

    `messages` go to /v1/chat/completions, `prompt` to /v1/completions (few-shot text as
    lm-eval's local-completions sends it); a task fills the one its settings ask for.
    """

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    stop: list[str] | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The server's answer to one question, as far as it came."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Scored:
    extracted: str | None
    correct: bool
    reason: str
    marks: dict[str, bool]
    gsm8k: GSM8KScore | None = None
    bfcl: BFCLScore | None = None


class EvalTask(Protocol[Q_contra]):
    """One eval, ready to run: data loaded and checked, scorer in hand."""

    @property
    def name(self) -> EvalName: ...

    @property
    def settings(self) -> GSM8KSettings | BFCLSettings: ...

    @property
    def headline(self) -> str:
        """The mark that `correct` and the score use."""
        ...

    @property
    def mark_names(self) -> tuple[str, ...]: ...

    @property
    def prompt_label(self) -> str: ...

    @property
    def data_label(self) -> str: ...

    @property
    def data_sha256(self) -> str | None: ...

    @property
    def checker_label(self) -> str: ...

    def questions(self) -> Sequence[Question]: ...

    def prepare(self, question: Q_contra) -> Prepared: ...

    def score(self, question: Q_contra, reply: Reply) -> Scored: ...
