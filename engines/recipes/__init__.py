"""Engine recipes: one data module per engine, and the one function that renders them.

    from engines.recipes import get_recipe, render
    served = render(get_recipe("vllm"), "vllm-d4", "8.9", model, 8010, drafter=drafter)
    EngineServer(served.engine, served.argv, env=..., port=served.port, ...)
    client settings: served.request_settings(RequestSettings(...))

`RECIPES` maps engine name to recipe; `recipe_for_arm` finds the recipe from an arm's
prefix (`llama-d2` -> llama.cpp). Unknown engines, arms, settings and drafter arms an
engine cannot run are `RecipeError`s whose one-line message names the engine and reason.
"""

from __future__ import annotations

from engines.recipes import jax, litertlm, llamacpp, mistralrs, pytorch, sglang, vllm
from engines.recipes.render import (
    Arm,
    RecipeError,
    RenderedInstallStep,
    RenderedServe,
    check_arm,
    parse_arm,
    render,
    render_install,
    resolve_settings,
    variant_key,
)
from engines.recipes.schema import EngineRecipe

__all__ = [
    "RECIPES",
    "Arm",
    "EngineRecipe",
    "RecipeError",
    "RenderedInstallStep",
    "RenderedServe",
    "check_arm",
    "get_recipe",
    "parse_arm",
    "recipe_for_arm",
    "render",
    "render_install",
    "resolve_settings",
    "variant_key",
]

RECIPES: dict[str, EngineRecipe] = {
    r.name: r
    for r in (
        llamacpp.RECIPE,
        vllm.RECIPE,
        sglang.RECIPE,
        mistralrs.RECIPE,
        pytorch.RECIPE,
        jax.RECIPE,
        litertlm.RECIPE,
    )
}
_BY_PREFIX = {r.arm_prefix: r for r in RECIPES.values()}
assert len(_BY_PREFIX) == len(RECIPES), "two recipes share an arm prefix"


def get_recipe(name: str) -> EngineRecipe:
    """The recipe called `name` (also its arm prefix, e.g. 'llama'); RecipeError if none."""
    recipe = RECIPES.get(name) or _BY_PREFIX.get(name)
    if recipe is None:
        known = ", ".join(sorted(RECIPES))
        raise RecipeError(name, f"unknown engine (known: {known})")
    return recipe


def recipe_for_arm(arm: str) -> EngineRecipe:
    """The recipe whose arm prefix starts `arm` ('sglang-d4' -> SGLang)."""
    prefix = arm.split("-", 1)[0]
    recipe = _BY_PREFIX.get(prefix)
    if recipe is None:
        known = ", ".join(sorted(_BY_PREFIX))
        raise RecipeError(prefix, f"arm {arm!r} names no known engine (arm prefixes: {known})")
    return recipe
