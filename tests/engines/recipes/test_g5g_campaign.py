"""Seed 002's G5g campaign: the shipped spec validates against the recipes, and each of
its arms (vLLM, JAX, PyTorch) renders a command line for the G5g's T4G (sm_75) in float16
with the same context."""

from __future__ import annotations

from pathlib import Path

from agent.campaigns import CAMPAIGNS_DIR
from contract.gpus import gpu_family
from contract.spec import load_campaign
from engines.campaign import check_campaign
from engines.recipes import recipe_for_arm, render, render_install


def test_g5g_campaign_renders_every_arm_for_the_t4g(tmp_path: Path) -> None:
    spec = check_campaign(load_campaign(CAMPAIGNS_DIR / "g5g-three-runtimes.toml"))
    (shard,) = spec.shards
    family = gpu_family(shard.instance_type)
    assert family is not None and family.cpu_arch == "arm64" and family.compute_capability == (7, 5)
    assert set(shard.arms) == {"vllm", "jax", "pytorch"}
    for arm in shard.arms:
        recipe = recipe_for_arm(arm)
        model = spec.model.source_for(recipe.name)
        assert model == "google/gemma-4-E2B-it"
        served = render(
            recipe, arm, "7.5", model, settings=spec.arm_settings(arm), workdir=tmp_path
        )
        assert served.variant == "sm_75"
        assert served.settings["dtype"] == "float16"
        assert served.settings["context"] == 4096
        assert model in served.argv and "4096" in served.argv
        assert served.extra_body["chat_template_kwargs"] == {"enable_thinking": False}
    jax_install = render_install(recipe_for_arm("jax"), "7.5", python="/venv/bin/python")
    # The engine's environment gets the project too: `python -m engines.jax` runs from it.
    assert "jax[cuda12]==0.10.2" in jax_install[0].argv
    assert jax_install[0].argv[-2] == "--editable" and jax_install[0].argv[-1].endswith("[jax]")
    jax = render(recipe_for_arm("jax"), "jax", "7.5", "google/gemma-4-E2B-it")
    assert jax.argv[1:3] == ("-m", "engines.jax") and jax.port == 8200
