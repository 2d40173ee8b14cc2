"""Which engine an arm runs and whether it drafts: the grouping the per-engine tables use."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from report.load import ArmResults

__all__ = [
    "ENGINE_NAMES",
    "drafted_tokens",
    "drafter_label",
    "engine_groups",
    "engine_name",
    "is_drafter",
]

# How the seeds name the engines in their tables.
# Display names for manifests older than ArmFacts (the recipes' display_name is the source).
ENGINE_NAMES = {
    "llamacpp": "llama.cpp",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "mistralrs": "mistral.rs",
    "pytorch": "PyTorch",
    "litertlm": "LiteRT-LM",
}
_DRAFT = re.compile(r"-d(\d*)$")


# Manifests older than ArmFacts say nothing of an arm that never started: its engine is then
# told by its name's prefix, as engines/recipes spells arms (llama-d2 -> llamacpp).
_PREFIX_ENGINE = {"llama": "llamacpp", "litert": "litertlm"}


def engine_name(arm: ArmResults) -> str:
    if arm.facts is not None:
        return arm.facts.display_name
    if arm.engine is not None:
        engine = arm.engine.engine
    else:
        prefix = arm.arm.split("-", 1)[0]
        engine = _PREFIX_ENGINE.get(prefix, prefix)
    return ENGINE_NAMES.get(engine, engine)


def engine_groups(arms: Sequence[ArmResults]) -> Callable[[ArmResults], str]:
    """How arms are grouped into engines for the drafter, best-per-level and GSM8K-time
    tables: by engine, and by instance type (or results folder) too where the results span
    several (a drafter's gain or an engine's best is a figure of one GPU)."""
    several = len({a.where for a in arms}) > 1

    def group(arm: ArmResults) -> str:
        name = engine_name(arm)
        return f"{name} ({arm.where})" if several else name

    return group


def drafted_tokens(arm: ArmResults) -> str | None:
    """'4 tokens' for 'vllm-d4', 'its own' for a bare '-d'; None for no drafter."""
    if arm.facts is not None:
        n = arm.facts.draft_tokens
        if not arm.facts.drafter:
            return None
        if n is None:
            return "its own"
        return f"{n} token" if n == 1 else f"{n} tokens"
    if not arm.drafter and not _DRAFT.search(arm.arm):
        return None
    match = _DRAFT.search(arm.arm)
    if match is None or not match.group(1):
        return "its own"
    n = int(match.group(1))
    return f"{n} token" if n == 1 else f"{n} tokens"


def is_drafter(arm: ArmResults) -> bool:
    if arm.facts is not None:
        return arm.facts.drafter
    return arm.drafter or _DRAFT.search(arm.arm) is not None




def drafter_label(arm: ArmResults) -> str:
    tokens = drafted_tokens(arm)
    if tokens is None:
        return "none"
    return "own drafter" if tokens == "its own" else f"{tokens.split()[0]} drafted"
