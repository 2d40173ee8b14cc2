"""The typed shape of an engine recipe: data only, validated once when a recipe is built.

A recipe says how to install an engine at its pinned version, how to start its server
(an argv template plus one `Flag` per serving setting), how to tell it is ready, what every
request must carry (thinking off, prompt cache off, the forced-output fields it accepts),
which settings it has and their defaults from the seeds' L4 and T4 runs, what changes on
a GPU architecture (`GpuVariant`, keyed like `sm_75`), and how a drafter arm is spelled for
it, or why it cannot run one. `engines.recipes.render` turns a recipe, an arm and a GPU
into the argv and request extras of one server; nothing here runs anything.

Placeholders: the serve template and drafter arguments use `{name}` for `model`, `port`,
`host`, `python`, `binary`, `workdir`, `served_model`, `drafter`, `draft_tokens` and
`draft_tokens_plus_one`; a `JsonArg` renders a dict to one JSON argument, where a value
that is exactly "{name}" takes the placeholder's typed value (an int stays an int).
Install steps use `{python}` (the engine's interpreter), `{bench_python}` (the project's),
`{project}` (the project's source tree, for engines that are the project's own code),
`{cuda_arch}`, `{site_packages}`, `{patch_dir}`, `{version}`, `{bin_dir}` (linked binaries, on
the servers' PATH) and `{install_dir}` (the engine's install folder, whose logs are uploaded).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from contract.frozen import FrozenModel
from contract.suite import ForceOutputMode

__all__ = [
    "ConfigFile",
    "DrafterArgs",
    "DrafterRefusal",
    "EngineRecipe",
    "Flag",
    "GpuVariant",
    "InstallStep",
    "JsonArg",
    "ReadyCheck",
    "SettingSpec",
    "SettingValue",
]

SettingValue = bool | int | float | str | None
SettingType = Literal["int", "float", "str", "bool"]

SERVE_PLACEHOLDERS = frozenset(
    {"model", "port", "host", "python", "binary", "workdir", "served_model"}
)
DRAFTER_PLACEHOLDERS = SERVE_PLACEHOLDERS | {"drafter", "draft_tokens", "draft_tokens_plus_one"}
INSTALL_PLACEHOLDERS = frozenset(
    {
        "python",
        "bench_python",
        "project",
        "cuda_arch",
        "site_packages",
        "patch_dir",
        "version",
        "bin_dir",
        "install_dir",
    }
)
_PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")
VARIANT_KEY_RE = re.compile(r"^(cpu|sm_\d{2,3}[a-z]?)$")


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER_RE.findall(text))


class _Record(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


class SettingSpec(_Record):
    """One serving setting: its type, default, allowed values, and where the default is from."""

    type: SettingType
    default: SettingValue = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    help: str
    source: str = Field(description="where the default comes from (seed and GPU, or 'derived')")

    def check(self, value: SettingValue) -> str | None:
        """None if `value` fits this setting, else why not (one short phrase)."""
        if value is None:
            return None
        ok = {
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "str": isinstance(value, str),
        }[self.type]
        if not ok:
            return f"expected {self.type}, got {type(value).__name__} {value!r}"
        if self.choices is not None and str(value) not in self.choices:
            return f"{value!r} is not one of {', '.join(self.choices)}"
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                return f"{value!r} is below the minimum {self.minimum:g}"
            if self.maximum is not None and value > self.maximum:
                return f"{value!r} is above the maximum {self.maximum:g}"
        return None

    @model_validator(mode="after")
    def _default_fits(self) -> SettingSpec:
        problem = self.check(self.default)
        if problem:
            raise ValueError(f"default: {problem}")
        return self


class Flag(_Record):
    """How one setting becomes command-line arguments; a None value leaves it out.

    `value`: [flag, formatted value]. `switch`: [flag] when True, nothing when False.
    `switch_pair`: [flag] when True, [off_flag] when False.
    """

    setting: str
    flag: str
    form: Literal["value", "switch", "switch_pair"] = "value"
    off_flag: str | None = None
    value_format: str = Field("{value}", description="e.g. '{value}tokens'")

    @model_validator(mode="after")
    def _pair_has_off(self) -> Flag:
        if (self.form == "switch_pair") != (self.off_flag is not None):
            raise ValueError("off_flag is required for switch_pair and only there")
        return self


class JsonArg(_Record):
    """One argument rendered as compact JSON from a template dict."""

    template: dict[str, object]


class InstallStep(_Record):
    """One install step; rerunnable alone. `kind` says what tool it drives."""

    name: str
    kind: Literal["pip", "cargo", "cmake", "patch"]
    argv: tuple[str, ...]
    env: dict[str, str] = Field(default_factory=dict)
    why: str

    @model_validator(mode="after")
    def _known_placeholders(self) -> InstallStep:
        found = set().union(
            *(placeholders(a) for a in self.argv), *map(placeholders, self.env.values())
        )
        unknown = found - INSTALL_PLACEHOLDERS
        if unknown:
            raise ValueError(f"install step {self.name!r}: unknown placeholders {sorted(unknown)}")
        return self


class ReadyCheck(_Record):
    """How readiness is told: health 200 on `health_path`, then a real first completion."""

    health_path: str = "/health"
    health_timeout_s: float = Field(gt=0)
    first_completion_timeout_s: float = Field(gt=0)
    why: str = ""


class ConfigFile(_Record):
    """Settings an engine reads from a JSON file instead of flags (LiteRT-LM's config.json).

    The file is `{section: {key: value}}` with one entry per setting in `keys` whose value
    is not None; its path is `{workdir}/<name>` in the argv.
    """

    name: str
    section: str
    keys: dict[str, str] = Field(description="setting name -> key in the file")


class DrafterArgs(_Record):
    """How a drafter arm is spelled for an engine that can run one."""

    args: tuple[str | JsonArg, ...] = ()
    token_count: Literal["required", "engine"] = Field(
        description="'required': arms say -dN; 'engine': the engine sets its own (arm '-d')"
    )
    max_tokens: int = Field(16, ge=1)
    needs_model: bool = Field(description="True when the drafter is a separate model/file")
    settings: dict[str, SettingValue] = Field(
        default_factory=dict, description="settings a drafter arm changes"
    )
    note: str = ""


class DrafterRefusal(_Record):
    """An engine that cannot run a drafter: arms asking for one are refused with `reason`."""

    reason: str


class GpuVariant(_Record):
    """What changes on one GPU architecture (or 'cpu'): settings, args, install, patches."""

    settings: dict[str, SettingValue] = Field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    install: tuple[InstallStep, ...] | None = Field(
        None, description="replaces the recipe's install steps when given"
    )
    extra_install: tuple[InstallStep, ...] = Field(
        (), description="appended after the (base or replaced) install steps"
    )
    patches: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    drafter_refusal: str | None = Field(
        None, description="this architecture cannot run the engine's drafter, and why"
    )
    why: str


class EngineRecipe(_Record):
    """Everything the agent needs to install, serve and ready one engine; data only."""

    name: str = Field(pattern=r"^[a-z][a-z0-9.-]*$")
    display_name: str
    arm_prefix: str = Field(pattern=r"^[a-z][a-z0-9]*$", description="'llama' in 'llama-d2'")
    arm_labels: dict[str, str] = Field(
        default_factory=dict, description="optional arm label -> what it means (no argv effect)"
    )
    version: str
    version_note: str = ""
    install: tuple[InstallStep, ...]
    binary: str | None = Field(None, description="default for {binary}: the server executable")
    serve: tuple[str, ...]
    flags: tuple[Flag, ...] = ()
    config_file: ConfigFile | None = None
    settings: dict[str, SettingSpec]
    port: int = Field(ge=1, le=65535)
    ready: ReadyCheck
    served_model: str | None = Field(
        None, description="model name requests must carry; None: the first of /v1/models"
    )
    request_extras: dict[str, object] = Field(default_factory=dict)
    thinking_off: dict[str, object] = Field(
        description="merged into every request body unless thinking is asked for"
    )
    force_output: ForceOutputMode
    env: dict[str, str] = Field(default_factory=dict, description="fixed, non-secret")
    env_names: tuple[str, ...] = Field(
        (), description="variables passed through from the environment by NAME (HF_TOKEN)"
    )
    requires_gpu: bool
    variants: dict[str, GpuVariant] = Field(default_factory=dict)
    drafter: DrafterArgs | DrafterRefusal
    version_probe: tuple[str, ...] = Field(description="argv printing what exactly is installed")
    build_id: str = Field(description="template: {name} {version} {variant} {patches}")

    @model_validator(mode="after")
    def _consistent(self) -> EngineRecipe:
        problems: list[str] = []
        for flag in self.flags:
            if flag.setting not in self.settings:
                problems.append(f"flag {flag.flag} names unknown setting {flag.setting!r}")
        if self.config_file:
            for key in self.config_file.keys:
                if key not in self.settings:
                    problems.append(f"config file names unknown setting {key!r}")
        flagged = {f.setting for f in self.flags} | set(
            self.config_file.keys if self.config_file else ()
        )
        for name in self.settings:
            if name not in flagged:
                problems.append(f"setting {name!r} reaches no flag and no config key")
        unknown = set().union(*(placeholders(t) for t in self.serve)) - SERVE_PLACEHOLDERS
        if unknown:
            problems.append(f"serve template: unknown placeholders {sorted(unknown)}")
        if any("{binary}" in t for t in self.serve) and self.binary is None:
            problems.append("serve template uses {binary} but the recipe names no binary")
        for key, variant in self.variants.items():
            if not VARIANT_KEY_RE.match(key):
                problems.append(f"variant key {key!r}: expected 'cpu' or 'sm_NN'")
            problems.extend(self._check_values(f"variant {key}", variant.settings))
        if isinstance(self.drafter, DrafterArgs):
            problems.extend(self._check_values("drafter", self.drafter.settings))
            for arg in self.drafter.args:
                texts = [arg] if isinstance(arg, str) else [str(v) for v in arg.template.values()]
                found = set().union(*(placeholders(t) for t in texts))
                if found - DRAFTER_PLACEHOLDERS:
                    problems.append(f"drafter args: unknown placeholders {sorted(found)}")
        for label in self.arm_labels:
            if not re.fullmatch(r"[a-z0-9]+", label) or re.fullmatch(r"d\d*", label):
                problems.append(f"arm label {label!r}: lowercase letters/digits, not d/dN")
        if self.requires_gpu and "cpu" in self.variants:
            problems.append("requires_gpu recipes have no 'cpu' variant")
        if problems:
            raise ValueError(f"recipe {self.name}: " + "; ".join(problems))
        return self

    def _check_values(self, where: str, values: dict[str, SettingValue]) -> list[str]:
        out = []
        for key, value in values.items():
            spec = self.settings.get(key)
            if spec is None:
                out.append(f"{where}: unknown setting {key!r}")
            elif problem := spec.check(value):
                out.append(f"{where}: setting {key!r}: {problem}")
        return out
