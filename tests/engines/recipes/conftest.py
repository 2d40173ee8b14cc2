"""Shared data for the recipe tests: every (recipe, arm, GPU variant) the recipes can render."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engines.recipes import RECIPES, EngineRecipe
from engines.recipes.schema import DrafterArgs

# The GPUs the seeds ran on, plus the machines the project runs on: CPU (None), a T4
# (sm_75), an L4 (sm_89), an H200 (sm_90).
GPUS: tuple[str | None, ...] = (None, "7.5", "8.9", "9.0")
DRAFTER = "google/gemma-4-E2B-it-assistant"
MODEL = "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text-emb4"


def arms_of(recipe: EngineRecipe) -> list[str]:
    """The seeds' arm names for one engine: plain, each label, drafter arms."""
    arms = [recipe.arm_prefix]
    arms += [f"{recipe.arm_prefix}-{label}" for label in recipe.arm_labels]
    if isinstance(recipe.drafter, DrafterArgs):
        if recipe.drafter.token_count == "required":
            arms += [f"{recipe.arm_prefix}-d{n}" for n in (1, 2, 3, 4)]
        else:
            arms += [f"{recipe.arm_prefix}-{label}-d" for label in recipe.arm_labels]
    return arms


def renderable() -> list[tuple[str, str, str | None]]:
    """(engine, arm, gpu) for every arm on every GPU the engine can run on."""
    cases = []
    for recipe in RECIPES.values():
        for gpu in GPUS:
            if gpu is None and recipe.requires_gpu:
                continue
            for arm in arms_of(recipe):
                cases.append((recipe.name, arm, gpu))
    return cases


def case_id(case: tuple[str, str, str | None]) -> str:
    _, arm, gpu = case
    return f"{arm}@{'cpu' if gpu is None else 'sm' + gpu.replace('.', '')}"


def workdir(tmp: Path) -> Path:
    return tmp / "serve-files"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's opt-in tests unless asked for (`-m optin` or BENCH_OPTIN=1).

    They download pinned wheels from PyPI and run engines installed by hand; CI's plain
    `pytest` must not. (pyproject.toml's addopts does not deselect the marker.)
    """
    asked = "optin" in (config.getoption("markexpr", "") or "") or os.environ.get("BENCH_OPTIN")
    if asked:
        return
    here = Path(__file__).resolve().parent
    skip = pytest.mark.skip(reason="opt-in: run with -m optin (or BENCH_OPTIN=1)")
    for item in items:
        if item.get_closest_marker("optin") and here in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
