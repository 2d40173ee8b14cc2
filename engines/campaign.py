"""Check a campaign spec against the engine recipes, before anything is launched or served.

`contract.spec` checks the spec's structure; this checks what only the recipes know: every
arm names an engine and an arm spelling it has, its setting overrides are settings it has,
a drafter arm is one the engine can run on the shard's GPU, and the model (and drafter)
has a source for that engine, every `sources` key is an engine name (or `default`): an
arm name there would silently fall back to the default source, and `engine_versions` names
engines that exist. The agent and the launcher both call it; `bench run` also asks
`arms_needing_gpu` before running anything here; `campaign_recipe` is the recipe an arm runs
with, the spec's version override applied.
"""

from __future__ import annotations

from contract.gpus import gpu_family
from contract.spec import LOCAL_INSTANCE_TYPE, CampaignSpec, SpecError
from engines.recipes import RECIPES, EngineRecipe, RecipeError, check_arm, recipe_for_arm

__all__ = ["arms_needing_gpu", "campaign_recipe", "check_campaign", "shard_compute_capability"]

DEFAULT_SOURCE = "default"


def shard_compute_capability(instance_type: str) -> tuple[int, int] | None:
    """The GPU variant an instance type selects; None (CPU variant) for `local` checks."""
    if instance_type == LOCAL_INSTANCE_TYPE:
        return None
    family = gpu_family(instance_type)
    if family is None:
        raise SpecError(f"instance_type {instance_type!r} is not a known NVIDIA GPU instance")
    return family.compute_capability


def check_campaign(spec: CampaignSpec) -> CampaignSpec:
    """Raise SpecError with one line naming the shard, the arm and the reason."""
    for table, model in (("model", spec.model), ("drafter", spec.drafter)):
        unknown = sorted(set(model.sources) - set(RECIPES) - {DEFAULT_SOURCE}) if model else []
        if unknown:
            raise SpecError(
                f"{table}.sources: {', '.join(repr(k) for k in unknown)} is not an engine name "
                f"(engines: {', '.join(sorted(RECIPES))}; or {DEFAULT_SOURCE!r})"
            )
    for engine, version in spec.engine_versions.items():
        if engine not in RECIPES:
            known = ", ".join(sorted(RECIPES))
            raise SpecError(f"engine_versions.{engine}: unknown engine (known: {known})")
        if not version.strip():
            raise SpecError(f"engine_versions.{engine}: empty version")
    for shard in spec.shards:
        gpu_cc = shard_compute_capability(shard.instance_type)
        for arm in shard.arms:
            where = f"shards.{shard.name}.arms.{arm}"
            try:
                recipe = recipe_for_arm(arm)
                drafter = spec.drafter.source_for(recipe.name) if spec.drafter else None
                check_arm(recipe, arm, gpu_cc, spec.arm_settings(arm), drafter=drafter)
            except RecipeError as exc:
                raise SpecError(f"{where}: {exc}") from exc
            if spec.model.source_for(recipe.name) is None:
                raise SpecError(
                    f"{where}: model {spec.model.name!r} has no source for {recipe.name} "
                    "(add model.sources.<engine> or model.sources.default)"
                )
    return spec


def arms_needing_gpu(spec: CampaignSpec) -> list[str]:
    """Arms whose engine cannot run without an NVIDIA GPU, in spec order."""
    arms = [arm for shard in spec.shards for arm in shard.arms]
    return [arm for arm in dict.fromkeys(arms) if recipe_for_arm(arm).requires_gpu]


def campaign_recipe(spec: CampaignSpec, arm: str) -> EngineRecipe:
    """The recipe `arm` runs with in this campaign: its engine's, at the spec's version if the
    spec overrides it (`engine_versions`). Raises RecipeError for an unknown arm."""
    recipe = recipe_for_arm(arm)
    version = spec.engine_versions.get(recipe.name)
    return recipe if version is None else recipe.model_copy(update={"version": version})
