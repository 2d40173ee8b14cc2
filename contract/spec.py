"""The campaign spec: what to measure, with which engines, on which machines.

A campaign is TOML, validated here once, before anything starts: unknown keys, wrong types
and out-of-range values are errors naming the field. This module checks the structure;
`engines.campaign.check_campaign` then checks every arm against its engine's recipe on the
shard's GPU (a drafter an engine can't run, an unknown setting). The agent and the
workstation launcher run the same two checks.

    name = "g6-six-engines"
    max_runtime_h = 14
    end_action = "terminate"

    [model]
    name = "gemma-4-e2b"
    [model.sources]            # per engine; "default" for the rest
    llamacpp = "hf:xbill9/gemma-4-E2B-it-qat-q4_0-exact-gguf/gemma-4-E2B_q4_0-it.gguf"
    default = "xbill9/gemma-4-E2B-it-qat-q4_0-w4a16-ct-text-emb4"

    [[shards]]
    name = "g6"
    instance_type = "g6.4xlarge"
    arms = ["llama", "llama-d2", "vllm", "vllm-d4"]

    [arms.vllm]                # optional per-arm setting overrides
    settings = { max_num_seqs = 64 }

    [engine_versions]          # optional: install another version than the recipe's pin
    litert-lm = "0.19.0"

    [suite.sweep]
    shapes = ["512/128", "128/512"]
    levels = [1, 2, 4, 8, 16, 32, 64]
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from contract.errors import BenchError
from contract.evals import BFCLSettings, GSM8KSettings
from contract.frozen import FrozenModel
from contract.suite import SUITE_ITEMS, ProbeSettings, Shape, SuiteItem, SweepSettings

__all__ = [
    "LOCAL_INSTANCE_TYPE",
    "ArmOverrides",
    "CampaignSpec",
    "ModelSpec",
    "ShardSpec",
    "SpecError",
    "SuiteSpec",
    "load_campaign",
    "parse_campaign",
]

# A shard that runs where `bench run` runs, not on a launched instance.
LOCAL_INSTANCE_TYPE = "local"
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,47}$")
_INSTANCE_TYPE = re.compile(r"^(local|[a-z][a-z0-9-]*\.[a-z0-9]+)$")
SettingValue = str | int | float | bool


class SpecError(BenchError, ValueError):
    """A campaign spec that cannot run: one line naming the file and the field."""


class _Spec(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


def _slug(value: str, what: str) -> str:
    if not _SLUG.match(value):
        raise ValueError(
            f"{what} {value!r} must be 1-48 lower-case letters, digits or '-', "
            "starting with a letter or digit (it becomes an S3 prefix and an SSM path)"
        )
    return value


class ModelSpec(_Spec):
    """A model by name, with where each engine loads it from."""

    name: str = Field(min_length=1, max_length=128)
    sources: dict[str, str] = Field(
        description="engine name -> model reference; key 'default' for every other engine"
    )

    @field_validator("sources")
    @classmethod
    def _not_empty(cls, sources: dict[str, str]) -> dict[str, str]:
        if not sources:
            raise ValueError("at least one source (e.g. default = 'org/model')")
        return sources

    def source_for(self, engine: str) -> str | None:
        return self.sources.get(engine, self.sources.get("default"))


class ArmOverrides(_Spec):
    settings: dict[str, SettingValue] = Field(default_factory=dict)


class ShardSpec(_Spec):
    """Which arms run on one machine (one instance, or this machine for `local`)."""

    name: str
    instance_type: str = Field(description="e.g. g6.4xlarge, or 'local'")
    arms: tuple[str, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return _slug(name, "shard name")

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        if not _INSTANCE_TYPE.match(value):
            raise ValueError(
                f"instance_type {value!r} is not an EC2 type like g6.4xlarge or 'local'"
            )
        return value

    @field_validator("arms")
    @classmethod
    def _arms_unique(cls, arms: tuple[str, ...]) -> tuple[str, ...]:
        repeated = sorted({a for a in arms if arms.count(a) > 1})
        if repeated:
            raise ValueError(f"arms listed twice: {', '.join(repeated)}")
        return arms


class SuiteSpec(_Spec):
    """The suite items every arm runs; leave one out (or set it to false) to skip it."""

    probe: ProbeSettings | None = ProbeSettings()
    sweep: SweepSettings | None = SweepSettings()
    gsm8k: GSM8KSettings | None = None
    bfcl: BFCLSettings | None = None

    @field_validator("probe", "sweep", "gsm8k", "bfcl", mode="before")
    @classmethod
    def _false_means_off(cls, value: object) -> object:
        return None if value is False else value

    @field_validator("sweep", mode="before")
    @classmethod
    def _shapes_as_text(cls, value: object) -> object:
        if isinstance(value, dict) and isinstance(value.get("shapes"), list):
            shapes = [Shape.parse(s) if isinstance(s, str) else s for s in value["shapes"]]
            value = {**value, "shapes": shapes}
        return value

    def items(self) -> list[SuiteItem]:
        """Enabled items in the order they run."""
        return [n for n in SUITE_ITEMS if getattr(self, n) is not None]


class CampaignSpec(_Spec):
    name: str
    description: str = ""
    model: ModelSpec
    drafter: ModelSpec | None = None
    arms: dict[str, ArmOverrides] = Field(default_factory=dict)
    engine_versions: dict[str, str] = Field(
        default_factory=dict, description="engine name -> version to install instead of its pin"
    )
    shards: tuple[ShardSpec, ...] = Field(min_length=1)
    suite: SuiteSpec = SuiteSpec()
    max_runtime_h: float = Field(12.0, gt=0, le=168)
    end_action: Literal["terminate", "stay"] = "terminate"

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return _slug(name, "campaign name")

    @model_validator(mode="after")
    def _cross_checks(self) -> CampaignSpec:
        names = [s.name for s in self.shards]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"shards: names used twice: {', '.join(repeated)}")
        listed = {arm for shard in self.shards for arm in shard.arms}
        unused = sorted(set(self.arms) - listed)
        if unused:
            raise ValueError(f"arms: {', '.join(unused)} configured but in no shard")
        return self

    def shard(self, name: str) -> ShardSpec:
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise SpecError(f"campaign {self.name!r} has no shard {name!r}")

    def arm_settings(self, arm: str) -> dict[str, SettingValue]:
        overrides = self.arms.get(arm)
        return dict(overrides.settings) if overrides else {}


def _one_line(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {message}{more}"


def parse_campaign(text: str, *, source: str = "spec") -> CampaignSpec:
    """Parse and validate TOML text; SpecError with one line on any problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{source}: not valid TOML: {exc}") from exc
    try:
        return CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_one_line(exc)}") from exc
    except ValueError as exc:
        raise SpecError(f"{source}: {exc}") from exc


def load_campaign(path: Path) -> CampaignSpec:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return parse_campaign(text, source=str(path))
