"""Every engine pin of the shipped campaigns installs on its instances (PyPI, asked for real).

The resolution is pip's own (`pip install --dry-run --no-deps --only-binary :all:` for the
instance's platform and Python), against the index this machine and CI reach: PyPI. No wheel
is downloaded, so the whole check is a few seconds of index reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from contract.spec import CampaignSpec, load_campaign
from engines.campaign import campaign_recipe, check_campaign
from engines.pins import INSTANCE_PYTHON, check_pins, pip_platforms, resolve_on_index
from engines.recipes import get_recipe
from engines.recipes.litertlm import SEED_VERSION

CAMPAIGNS = Path(__file__).resolve().parents[2] / "agent" / "campaigns"


def _shipped() -> list[CampaignSpec]:
    return [check_campaign(load_campaign(path)) for path in sorted(CAMPAIGNS.glob("*.toml"))]


def test_every_pinned_engine_of_the_shipped_campaigns_resolves_for_its_instance():
    checks = check_pins(_shipped())
    assert {c.engine for c in checks} >= {
        "llamacpp", "vllm", "sglang", "mistralrs", "pytorch", "litert-lm"
    }  # fmt: skip
    bad = [c.line() for c in checks if not c.ok]
    assert bad == []
    by_engine = {c.engine: c for c in checks}
    assert by_engine["vllm"].how == "pypi" and "manylinux" in by_engine["vllm"].detail
    assert by_engine["litert-lm"].version == "0.18.1"
    assert by_engine["mistralrs"].how == "source" and "v0.9.5" in by_engine["mistralrs"].detail


def test_the_seeds_litert_version_is_an_override_that_does_not_resolve_yet():
    (g6,) = [s for s in _shipped() if s.name == "g6-six-engines"]
    seeds = g6.model_copy(update={"engine_versions": {"litert-lm": SEED_VERSION}})
    assert campaign_recipe(seeds, "litert-int248").version == SEED_VERSION == "0.19.0"
    assert campaign_recipe(g6, "litert-int248").version == get_recipe("litert-lm").version
    found = resolve_on_index([f"litert-lm=={SEED_VERSION}"], "x86_64", INSTANCE_PYTHON)
    assert found == {"litert-lm==0.19.0": None}


def _fake(missing: set[str]):
    def resolve(reqs: Sequence[str], arch: str, python: str) -> dict[str, str | None]:
        return {r: None if r in missing else f"{r}-{arch}.whl" for r in reqs}

    return resolve


def test_an_unpublished_version_is_one_line_naming_engine_version_and_platform():
    (g6,) = [s for s in _shipped() if s.name == "g6-six-engines"]
    checks = check_pins([g6], resolve=_fake({"vllm==0.33.0"}))
    (bad,) = [c for c in checks if not c.ok]
    assert bad.engine == "vllm" and "\n" not in bad.line()
    assert "vllm==0.33.0" in bad.line() and "x86_64" in bad.line() and "3.12" in bad.line()


def test_an_arm64_shard_is_resolved_for_aarch64(tmp_path: Path):
    spec = tmp_path / "g5g.toml"
    spec.write_text(
        'name = "g5g"\n[model]\nname = "m"\nsources = { default = "org/m" }\n'
        '[[shards]]\nname = "a"\ninstance_type = "g5g.2xlarge"\narms = ["vllm"]\n'
    )
    asked: list[str] = []

    def resolve(reqs: Sequence[str], arch: str, python: str) -> dict[str, str | None]:
        asked.append(arch)
        return {r: "w.whl" for r in reqs}

    (check,) = check_pins([check_campaign(load_campaign(spec))], resolve=resolve)
    assert asked == ["aarch64"] and check.arch == "aarch64" and check.ok


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_platform_tags_cover_every_manylinux_up_to_the_amis_glibc(arch: str):
    tags = pip_platforms(arch, (2, 39))
    assert tags[0] == f"manylinux_2_39_{arch}" and f"manylinux_2_17_{arch}" in tags
    assert f"manylinux2014_{arch}" in tags


def test_engine_versions_naming_an_unknown_engine_is_a_spec_error(tmp_path: Path):
    from contract.spec import SpecError

    spec = tmp_path / "s.toml"
    spec.write_text(
        'name = "s"\n[engine_versions]\nlitert = "0.19.0"\n[model]\nname = "m"\n'
        'sources = { default = "org/m" }\n'
        '[[shards]]\nname = "a"\ninstance_type = "g6.xlarge"\narms = ["vllm"]\n'
    )
    with pytest.raises(SpecError, match=r"engine_versions\.litert: unknown engine"):
        check_campaign(load_campaign(spec))


def test_an_unreachable_index_is_an_error_not_a_missing_version(monkeypatch: pytest.MonkeyPatch):
    # A proxy that refuses connections: what pip meets on a machine with no network.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip names the connection error when it retries
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(OSError, match="not reachable"):
        resolve_on_index(["vllm==0.33.0"], "x86_64")
