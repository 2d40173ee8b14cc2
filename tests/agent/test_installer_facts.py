"""Install facts for the manifest, from each recipe's rendered install for a GPU."""

from __future__ import annotations

import pytest

from agent.installer import install_facts
from engines.recipes import get_recipe, render_install


@pytest.mark.parametrize(
    ("engine", "cc", "facts"),
    [
        # Seed 001's T4 SGLang: two patches and vLLM's kernels beside it, nothing compiled.
        (
            "sglang",
            (7, 5),
            (
                ("sglang-marlin-sm75-via-vllm", "sglang-marlin-atomic-add-off"),
                ("vllm==0.33.0",),
                False,
            ),
        ),
        ("sglang", (8, 9), ((), (), False)),
        ("vllm", (7, 5), (("vllm-triton-tile-clamp-sm75",), (), False)),
        ("llamacpp", None, ((), (), True)),
        ("mistralrs", (8, 9), ((), (), True)),
        ("pytorch", None, ((), (), False)),
    ],
)
def test_install_facts_follow_the_recipe(engine: str, cc: tuple[int, int] | None, facts: tuple):
    recipe = get_recipe(engine)
    assert install_facts(recipe, render_install(recipe, cc)) == facts
