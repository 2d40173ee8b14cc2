"""The campaign spec: shipped specs validate; each kind of mistake is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.campaigns import CAMPAIGNS_DIR, LOCAL_DEFAULT
from contract.spec import SpecError, load_campaign, parse_campaign
from engines.campaign import check_campaign

GOOD = """
name = "c1"
[model]
name = "m"
sources = { default = "org/model" }
[[shards]]
name = "g6"
instance_type = "g6.4xlarge"
arms = ["vllm", "llama"]
"""


@pytest.mark.parametrize("path", sorted(CAMPAIGNS_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_campaigns_validate_against_the_recipes(path: Path):
    spec = check_campaign(load_campaign(path))
    assert spec.shards and spec.suite.items()


def test_local_default_runs_on_this_machine():
    spec = load_campaign(LOCAL_DEFAULT)
    assert [s.instance_type for s in spec.shards] == ["local"]
    assert spec.end_action == "stay"


def test_defaults_and_shapes_from_text():
    spec = parse_campaign(GOOD + '[suite.sweep]\nshapes = ["512/128"]\nlevels = [4, 1]\n')
    assert spec.suite.sweep is not None
    assert spec.suite.sweep.shapes[0].name == "in512-out128"
    assert spec.suite.sweep.levels == (1, 4)
    assert spec.suite.items() == ["probe", "sweep"]
    assert spec.max_runtime_h == 12 and spec.end_action == "terminate"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("colour = 'red'\n", "colour: Extra inputs are not permitted"),
        ("max_runtime_h = 'long'\n", "max_runtime_h: Input should be a valid number"),
        ("max_runtime_h = 500\n", "max_runtime_h: Input should be less than or equal to 168"),
        ("end_action = 'explode'\n", "end_action: Input should be 'terminate' or 'stay'"),
        (
            "[suite.sweep]\nlevels = [0, 2]\n",
            "suite.sweep.levels: concurrency levels must be 1..1024",
        ),
        ("[suite.sweep]\nshapes = ['512x128']\n", "shape '512x128'"),
        ("[suite.probe]\nrepeats = 0\n", "suite.probe.repeats: Input should be greater than"),
        ("[arms.sglang]\nsettings = {}\n", "arms: sglang configured but in no shard"),
    ],
)
def test_each_structural_mistake_is_one_line_naming_the_field(extra: str, message: str):
    text = (
        GOOD.replace('name = "c1"\n', 'name = "c1"\n' + extra)
        if not extra.startswith("[")
        else GOOD + extra
    )
    with pytest.raises(SpecError) as info:
        parse_campaign(text, source="spec.toml")
    line = str(info.value)
    assert "\n" not in line and line.startswith("spec.toml: ")
    assert message in line


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ('["tgi"]', "arm 'tgi' names no known engine"),
        ('["vllm-x9"]', "vllm-x9"),
        ('["mistralrs-d2"]', "mistralrs"),
        ('["llama-d2"]', "needs a drafter model"),
    ],
)
def test_arms_are_checked_against_the_recipes(arms: str, message: str):
    spec = parse_campaign(GOOD.replace('["vllm", "llama"]', arms))
    with pytest.raises(SpecError) as info:
        check_campaign(spec)
    assert str(info.value).startswith("shards.g6.arms.") and message in str(info.value)


def test_unknown_setting_and_bad_names():
    spec = parse_campaign(GOOD + "[arms.vllm]\nsettings = { warp_speed = 9 }\n")
    with pytest.raises(SpecError, match="warp_speed"):
        check_campaign(spec)
    with pytest.raises(SpecError, match="campaign name 'Big Run'"):
        parse_campaign(GOOD.replace('name = "c1"', 'name = "Big Run"'))
    with pytest.raises(SpecError, match="not a known NVIDIA GPU instance"):
        check_campaign(parse_campaign(GOOD.replace("g6.4xlarge", "m5.large")))
    with pytest.raises(SpecError, match="not valid TOML"):
        parse_campaign("name = ")


def test_model_sources_keys_are_engine_names():
    """An arm name as a key ('llama', not 'llamacpp') would silently fall back to default."""
    spec = parse_campaign(
        GOOD.replace('{ default = "org/model" }', '{ llama = "hf:o/m/x.gguf", default = "o/m" }')
    )
    with pytest.raises(SpecError) as info:
        check_campaign(spec)
    message = str(info.value)
    assert message.startswith("model.sources: 'llama' is not an engine name")
    assert "llamacpp" in message and "\n" not in message
    fixed = GOOD.replace(
        '{ default = "org/model" }', '{ llamacpp = "hf:o/m/x.gguf", default = "o/m" }'
    )
    assert check_campaign(parse_campaign(fixed)).model.source_for("llamacpp") == "hf:o/m/x.gguf"


def test_arms_needing_a_gpu_are_named():
    from engines.campaign import arms_needing_gpu

    assert arms_needing_gpu(check_campaign(parse_campaign(GOOD))) == ["vllm"]
    assert arms_needing_gpu(check_campaign(load_campaign(LOCAL_DEFAULT))) == []
