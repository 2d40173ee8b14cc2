"""Settings of the measurement suite (probe and load sweep), validated once at the edge.

The campaign spec embeds these; `bench probe` and `bench sweep` build them from flags.
Unknown keys are errors, so a typo in a spec never silently falls back to a default.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from contract.frozen import FrozenModel

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_SHAPES",
    "EVAL_ITEMS",
    "SUITE_ITEMS",
    "ForceOutputMode",
    "ProbeSettings",
    "PromptCalibration",
    "RequestSettings",
    "Shape",
    "SuiteItem",
    "SweepMode",
    "SweepSettings",
]

# The suite's items, in the order an arm runs them: the one place they are spelled.
SuiteItem = Literal["probe", "sweep", "gsm8k", "bfcl"]
SUITE_ITEMS: tuple[SuiteItem, ...] = get_args(SuiteItem)
EVAL_ITEMS: tuple[SuiteItem, ...] = ("gsm8k", "bfcl")  # scored answers, not speed

MAX_CONCURRENCY = 1024
ForceOutputMode = Literal["ignore_eos+min_tokens", "ignore_eos", "min_tokens", "none"]
# burst: N at once; steady: N kept in flight; rate: open-loop arrivals at a request rate.
SweepMode = Literal["burst", "steady", "rate"]
MAX_REQUEST_RATE = 100_000.0


class _Settings(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


class Shape(_Settings):
    """A synthetic request shape: prompt tokens in, completion tokens out."""

    input_tokens: int = Field(ge=1, le=1_000_000)
    output_tokens: int = Field(ge=1, le=1_000_000)

    @property
    def name(self) -> str:
        return f"in{self.input_tokens}-out{self.output_tokens}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        """'512/128' or 'in512-out128' -> Shape."""
        cleaned = text.strip().replace("in", "").replace("out", "").replace("-", "/")
        parts = cleaned.split("/")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"shape {text!r}: expected INPUT/OUTPUT tokens, e.g. 512/128")
        return cls(input_tokens=int(parts[0]), output_tokens=int(parts[1]))


DEFAULT_SHAPES = (
    Shape(input_tokens=512, output_tokens=128),
    Shape(input_tokens=128, output_tokens=512),
)
DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64)


class RequestSettings(_Settings):
    """How each request is sent: shared by the probe, the sweep and the evals."""

    endpoint: Literal["chat", "completions"] = "chat"
    force_output: ForceOutputMode = Field(
        "ignore_eos+min_tokens",
        description="how the exact output length is asked for; what was sent is recorded",
    )
    thinking: bool = Field(
        False, description="sent as chat_template_kwargs.enable_thinking on chat requests"
    )
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    timeout_s: float = Field(600.0, gt=0, le=24 * 3600, description="per request, whole stream")
    extra_body: dict[str, object] = Field(
        default_factory=dict, description="merged into every request body (engine extras)"
    )


class PromptCalibration(_Settings):
    """What was learnt about the server's tokenizer before prompts were built."""

    tokenize_endpoint: str | None = Field(description="e.g. '/tokenize (vllm)', or None")
    template_overhead_tokens: int = Field(
        description="usage.prompt_tokens minus the raw content's tokens"
    )
    tokens_per_word: float
    text_source: str = Field("synthetic", description="where prompt words came from")
    text_sha256: str | None = Field(None, description="sha256 of the source's text")


class ProbeSettings(_Settings):
    """One-request probe: the seeds' six prompts, N repeats, then K requests at once."""

    output_tokens: int = Field(256, ge=2, le=32768)
    repeats: int = Field(3, ge=1, le=50)
    at_once: int = Field(4, ge=2, le=256)
    request: RequestSettings = RequestSettings()


class SweepSettings(_Settings):
    """Load sweep: every shape at every concurrency level, `repeats` measured windows each."""

    shapes: tuple[Shape, ...] = DEFAULT_SHAPES
    levels: tuple[int, ...] = DEFAULT_LEVELS
    repeats: int = Field(5, ge=1, le=100)
    mode: SweepMode = "burst"
    warmup: bool = Field(True, description="one unmeasured burst/window before each cell")
    steady_window_s: float = Field(30.0, gt=0, le=3600, description="steady and rate windows")
    steady_warmup_s: float = Field(5.0, ge=0, le=600, description="steady and rate warm-up")
    rates: tuple[float, ...] = Field(
        (), description="rate mode: requests per second, one cell per rate and shape"
    )
    burstiness: float = Field(
        1.0, gt=0, le=100, description="rate mode: gamma shape of the gaps (1 = Poisson)"
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=MAX_CONCURRENCY, description="rate mode: cap on requests in flight"
    )
    seed: int = Field(0, ge=0, description="rate mode: seed of the arrival process")
    prompts: str = Field(
        "synthetic",
        pattern=r"^(synthetic|gsm8k|bfcl|jsonl:.+)$",
        description="prompt text: shuffled filler words, GSM8K or BFCL questions, or a JSONL "
        "file's texts; always nonce first and cut to the exact length",
    )
    max_cell_s: float = Field(1800.0, gt=0, le=24 * 3600, description="bound per cell")
    slo_ttft_ms: float | None = Field(None, gt=0, description="goodput: TTFT objective")
    slo_tpot_ms: float | None = Field(None, gt=0, description="goodput: TPOT objective")
    slo_e2el_ms: float | None = Field(
        None, gt=0, description="goodput: end-to-end latency objective"
    )
    request: RequestSettings = RequestSettings()

    @field_validator("levels")
    @classmethod
    def _levels_in_range(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if not levels:
            raise ValueError("at least one concurrency level")
        bad = [level for level in levels if not 1 <= level <= MAX_CONCURRENCY]
        if bad:
            raise ValueError(f"concurrency levels must be 1..{MAX_CONCURRENCY}, got {bad}")
        return tuple(sorted(set(levels)))

    @field_validator("rates")
    @classmethod
    def _rates_in_range(cls, rates: tuple[float, ...]) -> tuple[float, ...]:
        bad = [rate for rate in rates if not 0 < rate <= MAX_REQUEST_RATE]
        if bad:
            raise ValueError(f"request rates must be in (0, {MAX_REQUEST_RATE:g}], got {bad}")
        return tuple(sorted(set(rates)))

    @model_validator(mode="after")
    def _shapes_present(self) -> SweepSettings:
        if not self.shapes:
            raise ValueError("at least one shape")
        if self.mode == "rate" and not self.rates:
            raise ValueError("rate mode needs at least one request rate (rates)")
        if self.mode != "rate" and self.rates:
            raise ValueError(f"rates are for rate mode; mode is {self.mode!r}")
        return self
