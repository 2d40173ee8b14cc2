"""Recipe + arm + GPU -> what to run: argv, environment names, request extras, files.

`render` is the one place a recipe turns into a server command; it validates the arm, the
GPU architecture and the setting overrides first, so bad input fails with one line naming
the engine and the reason, before anything is installed or started. `check_arm` runs the
same validation without a model or port, for campaign-spec validation.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field

from contract.errors import BenchError
from contract.frozen import FrozenModel
from contract.suite import ForceOutputMode, RequestSettings
from engines.patches import PATCH_DIR, PATCHES
from engines.recipes.project import project_source
from engines.recipes.schema import (
    DrafterArgs,
    DrafterRefusal,
    EngineRecipe,
    GpuVariant,
    InstallStep,
    JsonArg,
    ReadyCheck,
    SettingValue,
)

__all__ = [
    "Arm",
    "RecipeError",
    "RenderedInstallStep",
    "RenderedServe",
    "check_arm",
    "parse_arm",
    "render",
    "render_install",
    "resolve_settings",
    "variant_key",
]

GpuCC = str | float | tuple[int, int] | None


class RecipeError(BenchError, ValueError):
    """Bad input for a recipe: the message is one line naming the engine and the reason."""

    def __init__(self, engine: str, reason: str) -> None:
        self.engine = engine
        self.reason = reason
        super().__init__(f"{engine}: {reason}")


class Arm(FrozenModel):
    """A parsed arm name: `<prefix>[-<label>][-d<N>|-d]`, e.g. `vllm-d4`, `litert-int248`."""

    name: str
    prefix: str
    label: str | None = None
    drafter: bool = False
    draft_tokens: int | None = None


_ARM_RE = re.compile(r"^([a-z][a-z0-9]*)((?:-[a-z0-9]+)*)$")


def parse_arm(recipe: EngineRecipe, arm: str) -> Arm:
    """Parse and check an arm against a recipe (its prefix, labels and drafter spelling)."""
    m = _ARM_RE.match(arm)
    if m is None or m.group(1) != recipe.arm_prefix:
        raise RecipeError(
            recipe.name,
            f"arm {arm!r} is not one of this engine's arms "
            f"('{recipe.arm_prefix}', '{recipe.arm_prefix}-dN', '{recipe.arm_prefix}-<label>')",
        )
    parts = [p for p in m.group(2).split("-") if p]
    label: str | None = None
    drafter = False
    tokens: int | None = None
    for i, part in enumerate(parts):
        draft = re.fullmatch(r"d(\d*)", part)
        if draft and i == len(parts) - 1:
            drafter = True
            tokens = int(draft.group(1)) if draft.group(1) else None
        elif i == 0 and part in recipe.arm_labels:
            label = part
        else:
            known = ", ".join(sorted(recipe.arm_labels)) or "none"
            raise RecipeError(
                recipe.name, f"arm {arm!r}: unknown part {part!r} (labels: {known}; drafter: -dN)"
            )
    return Arm(name=arm, prefix=m.group(1), label=label, drafter=drafter, draft_tokens=tokens)


def variant_key(gpu_cc: GpuCC) -> str:
    """'cpu' for None; 'sm_75' for 7.5, '7.5', '75', 'sm_75', (7, 5); 'sm_90a' kept."""
    if gpu_cc is None:
        return "cpu"
    if isinstance(gpu_cc, tuple):
        major, minor = gpu_cc
        return f"sm_{major}{minor}"
    text = f"{gpu_cc}".strip().lower().removeprefix("sm_").removeprefix("sm")
    if text == "cpu":
        return "cpu"
    m = re.fullmatch(r"(\d+)\.(\d)([a-z]?)|(\d{2,3})([a-z]?)", text)
    if m is None:
        raise ValueError(f"GPU compute capability {gpu_cc!r}: expected e.g. 7.5, 'sm_89' or None")
    if m.group(1):
        return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"
    return f"sm_{m.group(4)}{m.group(5)}"


def _variant(recipe: EngineRecipe, gpu_cc: GpuCC) -> tuple[str, GpuVariant | None]:
    try:
        key = variant_key(gpu_cc)
    except ValueError as exc:
        raise RecipeError(recipe.name, str(exc)) from None
    if key == "cpu" and recipe.requires_gpu:
        raise RecipeError(recipe.name, "needs an NVIDIA GPU (no compute capability given)")
    return key, recipe.variants.get(key)


def resolve_settings(
    recipe: EngineRecipe,
    overrides: Mapping[str, SettingValue] | None = None,
    *,
    variant: GpuVariant | None = None,
    drafter: DrafterArgs | None = None,
) -> dict[str, SettingValue]:
    """Defaults, then the GPU variant's, then the drafter arm's, then the user's overrides.

    An unknown key or a value of the wrong type is a `RecipeError` naming engine and key.
    """
    values: dict[str, SettingValue] = {k: s.default for k, s in recipe.settings.items()}
    if variant:
        values.update(variant.settings)
    if drafter:
        values.update(drafter.settings)
    for key, value in (overrides or {}).items():
        spec = recipe.settings.get(key)
        if spec is None:
            known = ", ".join(sorted(recipe.settings))
            raise RecipeError(recipe.name, f"unknown setting {key!r} (known: {known})")
        if problem := spec.check(value):
            raise RecipeError(recipe.name, f"setting {key!r}: {problem}")
        values[key] = value
    return values


class RenderedInstallStep(FrozenModel):
    """One install step with its placeholders filled in."""

    name: str
    kind: Literal["pip", "cargo", "cmake", "patch"]
    argv: tuple[str, ...]
    env: dict[str, str]
    why: str


class RenderedServe(FrozenModel):
    """One server to start: what `EngineServer` runs and what the load generator sends."""

    engine: str
    arm: str
    version: str
    variant: str = Field(description="'cpu' or 'sm_NN': the GPU architecture rendered for")
    argv: tuple[str, ...]
    env: dict[str, str] = Field(description="fixed, non-secret environment for the server")
    env_names: tuple[str, ...] = Field(description="passed through from the environment")
    host: str
    port: int
    ready: ReadyCheck
    extra_body: dict[str, object]
    force_output: ForceOutputMode
    served_model: str | None
    files: dict[str, str] = Field(description="absolute path -> content, written before start")
    settings: dict[str, SettingValue]
    patches: tuple[str, ...]
    drafter: str | None
    draft_tokens: int | None
    build_id: str
    version_probe: tuple[str, ...]

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.base_url + self.ready.health_path

    def request_settings(self, base: RequestSettings | None = None) -> RequestSettings:
        """`base` with this engine's forced-output mode and request extras merged in."""
        base = base or RequestSettings()
        extra = {**self.extra_body, **base.extra_body}
        return base.model_copy(update={"force_output": self.force_output, "extra_body": extra})


def _fill(text: str, values: Mapping[str, object]) -> str:
    return re.sub(r"\{([a-z_]+)\}", lambda m: str(values[m.group(1)]), text)


def _fill_json(arg: JsonArg, values: Mapping[str, object]) -> str:
    def one(v: object) -> object:
        if isinstance(v, str):
            whole = re.fullmatch(r"\{([a-z_]+)\}", v)
            return values[whole.group(1)] if whole else _fill(v, values)
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return v

    return json.dumps(one(arg.template), separators=(",", ":"))


def _flag_args(recipe: EngineRecipe, settings: Mapping[str, SettingValue]) -> list[str]:
    argv: list[str] = []
    for flag in recipe.flags:
        value = settings[flag.setting]
        if value is None:
            continue
        if flag.form == "value":
            text = str(value).lower() if isinstance(value, bool) else str(value)
            argv += [flag.flag, flag.value_format.format(value=text)]
        elif value:
            argv.append(flag.flag)
        elif flag.form == "switch_pair" and flag.off_flag:
            argv.append(flag.off_flag)
    return argv


def _drafter_for(
    recipe: EngineRecipe, arm: Arm, variant: GpuVariant | None, drafter_model: str | None
) -> DrafterArgs | None:
    if not arm.drafter:
        return None
    spec = recipe.drafter
    if isinstance(spec, DrafterRefusal):
        raise RecipeError(recipe.name, f"arm {arm.name!r}: cannot run a drafter: {spec.reason}")
    if variant and variant.drafter_refusal:
        raise RecipeError(
            recipe.name, f"arm {arm.name!r}: cannot run a drafter here: {variant.drafter_refusal}"
        )
    if spec.token_count == "required" and arm.draft_tokens is None:
        raise RecipeError(recipe.name, f"arm {arm.name!r}: say how many tokens to draft (-dN)")
    if spec.token_count == "engine" and arm.draft_tokens is not None:
        raise RecipeError(
            recipe.name,
            f"arm {arm.name!r}: this engine's drafter sets its own draft length; "
            f"use '-d' without a number",
        )
    if arm.draft_tokens is not None and not 1 <= arm.draft_tokens <= spec.max_tokens:
        raise RecipeError(
            recipe.name, f"arm {arm.name!r}: draft tokens must be 1..{spec.max_tokens}"
        )
    if spec.needs_model and drafter_model is None:
        raise RecipeError(recipe.name, f"arm {arm.name!r}: needs a drafter model (none given)")
    return spec


def check_arm(
    recipe: EngineRecipe,
    arm: str,
    gpu_cc: GpuCC = None,
    settings: Mapping[str, SettingValue] | None = None,
    *,
    drafter: str | None = "<drafter>",
) -> Arm:
    """Validate an arm on a GPU with setting overrides, as `render` would; no model needed."""
    parsed = parse_arm(recipe, arm)
    _, variant = _variant(recipe, gpu_cc)
    spec = _drafter_for(recipe, parsed, variant, drafter)
    resolve_settings(recipe, settings, variant=variant, drafter=spec)
    return parsed


def render(
    recipe: EngineRecipe,
    arm: str,
    gpu_cc: GpuCC,
    model: str | Path,
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    settings: Mapping[str, SettingValue] | None = None,
    drafter: str | Path | None = None,
    thinking: bool = False,
    python: str = "python3",
    binary: str | Path | None = None,
    workdir: Path | None = None,
) -> RenderedServe:
    """The server for `arm` of `recipe` on a GPU of compute capability `gpu_cc` (None: CPU).

    `port` defaults to the recipe's; `python` is the interpreter the engine is installed
    in; `binary` overrides the recipe's server executable; `workdir` is where config files
    go (required by recipes that have one). Raises `RecipeError` on bad input.
    """
    parsed = parse_arm(recipe, arm)
    key, variant = _variant(recipe, gpu_cc)
    drafter_text = str(drafter) if drafter is not None else None
    spec = _drafter_for(recipe, parsed, variant, drafter_text)
    values = resolve_settings(recipe, settings, variant=variant, drafter=spec)
    port = recipe.port if port is None else port
    if not 1 <= port <= 65535:
        raise RecipeError(recipe.name, f"port {port} is out of range")
    if recipe.config_file is not None and workdir is None:
        raise RecipeError(recipe.name, f"needs a workdir for its {recipe.config_file.name}")
    workdir_abs = workdir.resolve() if workdir is not None else None

    fills: dict[str, object] = {
        "model": str(model),
        "port": port,
        "host": host,
        "python": python,
        "binary": str(binary) if binary is not None else (recipe.binary or ""),
        "workdir": str(workdir_abs) if workdir_abs else "",
        "drafter": drafter_text or "",
        "draft_tokens": parsed.draft_tokens if parsed.draft_tokens is not None else "",
        "draft_tokens_plus_one": parsed.draft_tokens + 1 if parsed.draft_tokens else "",
    }
    fills["served_model"] = _fill(recipe.served_model, fills) if recipe.served_model else ""
    argv = [_fill(t, fills) for t in recipe.serve]
    argv += _flag_args(recipe, values)
    if variant:
        argv += [_fill(t, fills) for t in variant.extra_args]
    if spec:
        for arg in spec.args:
            argv.append(_fill_json(arg, fills) if isinstance(arg, JsonArg) else _fill(arg, fills))

    files: dict[str, str] = {}
    if recipe.config_file is not None and workdir_abs is not None:
        cf = recipe.config_file
        body = {cf.keys[k]: values[k] for k in cf.keys if values[k] is not None}
        files[str(workdir_abs / cf.name)] = json.dumps({cf.section: body}, indent=2) + "\n"

    extra_body = dict(recipe.request_extras)
    if not thinking:
        extra_body.update(recipe.thinking_off)
    patches = variant.patches if variant else ()
    patch_tag = "+" + "+".join(patches) if patches else ""
    build_id = recipe.build_id.format(
        name=recipe.name, version=recipe.version, variant=key, patches=patch_tag
    )
    return RenderedServe(
        engine=recipe.name,
        arm=parsed.name,
        version=recipe.version,
        variant=key,
        argv=tuple(argv),
        env={**recipe.env, **(variant.env if variant else {})},
        env_names=recipe.env_names,
        host=host,
        port=port,
        ready=recipe.ready,
        extra_body=extra_body,
        force_output=recipe.force_output,
        # Ignored below: fills' values are strings; the recipe's placeholder is the model id.
        served_model=fills["served_model"] or None,  # type: ignore[arg-type]
        files=files,
        settings=values,
        patches=patches,
        drafter=drafter_text if spec and spec.needs_model else None,
        draft_tokens=parsed.draft_tokens,
        build_id=build_id,
        version_probe=tuple(_fill(t, fills) for t in recipe.version_probe),
    )


def render_install(
    recipe: EngineRecipe,
    gpu_cc: GpuCC,
    *,
    python: str = "python3",
    site_packages: str | Path = "{site_packages}",
    bin_dir: str | Path = "{bin_dir}",
    install_dir: str | Path = "{install_dir}",
) -> tuple[RenderedInstallStep, ...]:
    """The install steps for a GPU architecture, placeholders filled, patches last.

    `site_packages` is the engine environment's site-packages folder (where patch steps
    apply); `bin_dir` is where built binaries are linked (on the servers' PATH);
    `install_dir` is the engine's install folder (logs left there are uploaded); each left
    as a placeholder when not known yet.
    """
    key, variant = _variant(recipe, gpu_cc)
    steps: list[InstallStep] = list(recipe.install)
    if variant and variant.install is not None:
        steps = list(variant.install)
    if variant:
        steps += list(variant.extra_install)
    fills = {
        "python": python,
        "bench_python": sys.executable,
        # Looked up only when a step names it (our own engines), so other engines install
        # wherever the project came from.
        "project": str(project_source())
        if any("{project}" in a for s in steps for a in s.argv)
        else "{project}",
        "cuda_arch": key.removeprefix("sm_") if key != "cpu" else "",
        "site_packages": str(site_packages),
        "bin_dir": str(bin_dir),
        "install_dir": str(install_dir),
        "patch_dir": str(PATCH_DIR),
        "version": recipe.version,
    }
    out = [
        RenderedInstallStep(
            name=s.name,
            kind=s.kind,
            argv=tuple(_fill(a, fills) for a in s.argv),
            env={k: _fill(v, fills) for k, v in s.env.items()},
            why=s.why,
        )
        for s in steps
    ]
    for name in variant.patches if variant else ():
        info = PATCHES[name]
        out.append(
            RenderedInstallStep(
                name=f"patch {name}",
                kind="patch",
                # The project's interpreter applies it (engines.patches): idempotent, checks
                # the upstream file's sha256 first, and applies exactly or not at all.
                argv=(sys.executable, "-m", "engines.patches", "apply", name, str(site_packages)),
                env={},
                why=info.why,
            )
        )
    return tuple(out)
