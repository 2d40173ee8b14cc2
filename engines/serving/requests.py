"""What passes between the HTTP layer and an engine's scheduler: a generation request with
its sampling parameters, and the `StepOutput` records that come back, one per token.

Both engines (PyTorch, JAX) take and give exactly these, so the HTTP layer is one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Below this a temperature is treated as greedy (as vLLM does), so that 1e-9 does not
# divide the logits into infinities.
GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """Everything that decides which tokens a request gets and when it stops."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no top-k
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    def banned_ids(
        self, num_generated: int, eos_token_ids: tuple[int, ...], stop_ids: frozenset[int]
    ) -> list[int]:
        """Ids a request may not draw after `num_generated` tokens: EOS under `ignore_eos`,
        and every stop id until `min_tokens` exist."""
        banned: set[int] = set()
        if self.ignore_eos:
            banned.update(eos_token_ids)
        if num_generated < self.min_tokens:
            banned.update(stop_ids)
            banned.update(eos_token_ids)
        return sorted(banned)


@dataclass(frozen=True)
class GenerationRequest:
    """What the HTTP layer asks for: prompt ids and sampling parameters."""

    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class StepOutput:
    """One request's news from one step: its new token and text, and how it ended."""

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None  # "stop", "length", "error"
    stop_reason: str | int | None = None  # the stop string or stop token id, as vLLM
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# The scheduler thread hands each step's outputs over at once: (the request's handle, output).
Deliver = Callable[[list[tuple[object, StepOutput]]], None]
