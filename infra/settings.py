"""The stack's settings: parsed and checked from CDK context values before any resource is declared.

`app.py` reads the raw values (`-c key=value` on the command line, or the `context` block of
cdk.json) and hands them to `parse_settings`; a bad value raises `SettingsError` whose message
is one line naming the key, and `app.py` stops synth with it. Nothing here imports CDK, so the
rules are testable without Node.

Context keys (`-c key=value`), with their defaults:

- `azs` (us-east-1a,us-east-1b,us-east-1c,us-east-1d,us-east-1f): one public subnet per zone;
  the stack is pinned to the zones' region.
- `instance_type` (g6.xlarge): the default type of the launch templates of its architecture
  (the other architecture's templates name none: not every region offers G5g, and cfn-lint
  checks a named type against the region); campaigns set the type at launch.
- `root_volume_gib` (200): gp3 root volume size, 100-4000 GiB.
- `keep_results` (false): true keeps the results bucket and its objects on `cdk destroy`.
- `max_hours` (24): backstop; an instance powers off, and so terminates, this long after boot.
- `ami_parameter_x86_64`, `ami_parameter_arm64` (the DLAMI Base OSS NVIDIA Driver GPU Ubuntu
  24.04 parameter of each architecture): the public SSM parameters naming the AMIs of the two
  launch template pairs, resolved at every launch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from contract.errors import BenchError
from contract.gpus import CPU_ARCHITECTURES, GPU_FAMILIES

__all__ = [
    "CONTEXT_KEYS",
    "DEFAULT_AMI_PARAMETERS",
    "DEFAULT_AZS",
    "DEFAULT_INSTANCE_TYPE",
    "GPU_INSTANCE_FAMILIES",
    "SettingsError",
    "StackSettings",
    "parse_settings",
]

DEFAULT_AZS = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f")
DEFAULT_INSTANCE_TYPE = "g6.xlarge"
DEFAULT_ROOT_VOLUME_GIB = 200
DEFAULT_MAX_HOURS = 24
# Deep Learning Base OSS NVIDIA Driver GPU AMI (Ubuntu 24.04), x86_64 (G4dn, G5, G6, ...) and
# ARM64 (G5g): NVIDIA driver 595, CUDA toolkits, the SSM agent; Python 3.12 with boto3 as
# python3, which the agent needs (>= 3.11). Format per the DLAMI guide, "Finding the ID of a
# DLAMI": /aws/service/deeplearning/ami/<arch>/<ami-type>/latest/ami-id.
DLAMI_TYPE = "base-oss-nvidia-driver-gpu-ubuntu-24.04"
DEFAULT_AMI_PARAMETERS: Mapping[str, str] = {
    arch: f"/aws/service/deeplearning/ami/{arch}/{DLAMI_TYPE}/latest/ami-id"
    for arch in CPU_ARCHITECTURES
}

ROOT_VOLUME_GIB_RANGE = (100, 4000)  # the DLAMI snapshot needs ~100; 4000 is a typo guard
MAX_HOURS_RANGE = (1, 168)

# EC2 instance families with NVIDIA GPUs (contract/gpus.py) -> the AMI architecture they need.
GPU_INSTANCE_FAMILIES: Mapping[str, str] = {
    family: spec.cpu_arch for family, spec in GPU_FAMILIES.items()
}

CONTEXT_KEYS = (
    "azs",
    "instance_type",
    "root_volume_gib",
    "keep_results",
    "max_hours",
    *(f"ami_parameter_{arch}" for arch in CPU_ARCHITECTURES),
)

# Region-style AZ names (us-east-1a, eu-central-1b, us-gov-west-1a, ap-southeast-7c);
# Local/Wavelength Zones (us-east-1-bos-1a) are out: their subnets need other settings.
_AZ = re.compile(r"(?P<region>[a-z]{2}(?:-gov|-iso[a-z]?)?-[a-z]+-\d{1,2})[a-z]")
_INSTANCE_TYPE = re.compile(r"(?P<family>[a-z][a-z0-9-]*)\.(?P<size>[a-z0-9-]+)")
_SSM_PARAMETER = re.compile(r"/[A-Za-z0-9_.\-/]{1,1010}")
_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


class SettingsError(BenchError, ValueError):
    """A context value is unusable; the message is one line that names the key."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSettings:
    """Checked settings for `BenchStack`.

    Attributes:
        availability_zones: AZ names, one public subnet each, all in `region`.
        region: the region the AZ names belong to; the stack is pinned to it.
        instance_type: the default instance type of its architecture's launch templates.
        architecture: `x86_64` or `arm64`, from the instance type's family.
        instance_types: architecture -> its launch templates' default instance type (only
            `architecture` has one).
        root_volume_gib: the gp3 root volume size.
        keep_results: keep the results bucket (and its objects) on `cdk destroy`.
        max_hours: hours after boot at which an instance powers itself off, whatever happens.
        ami_parameters: architecture -> public SSM parameter holding its AMI id, resolved
            at each launch.
    """

    availability_zones: tuple[str, ...]
    region: str
    instance_type: str
    architecture: str
    root_volume_gib: int
    keep_results: bool
    max_hours: int
    ami_parameters: Mapping[str, str]
    instance_types: Mapping[str, str]


def parse_settings(context: Mapping[str, object]) -> StackSettings:
    """Check raw context values (strings from `-c`, or JSON values from cdk.json).

    Args:
        context: context key -> raw value; absent keys take their defaults.

    Raises:
        SettingsError: a value is malformed, out of range or inconsistent with another.
    """
    azs, region = _parse_azs(context.get("azs"))
    instance_type, architecture = _parse_instance_type(context.get("instance_type"))
    ami_parameters = {
        arch: _parse_ami_parameter(arch, context.get(f"ami_parameter_{arch}"))
        for arch in CPU_ARCHITECTURES
    }
    return StackSettings(
        availability_zones=azs,
        region=region,
        instance_type=instance_type,
        architecture=architecture,
        root_volume_gib=_parse_int(
            "root_volume_gib",
            context.get("root_volume_gib"),
            DEFAULT_ROOT_VOLUME_GIB,
            ROOT_VOLUME_GIB_RANGE,
            unit="GiB",
        ),
        keep_results=_parse_bool("keep_results", context.get("keep_results"), default=False),
        max_hours=_parse_int(
            "max_hours", context.get("max_hours"), DEFAULT_MAX_HOURS, MAX_HOURS_RANGE, unit="hours"
        ),
        ami_parameters=ami_parameters,
        instance_types={architecture: instance_type},
    )


def _parse_azs(raw: object) -> tuple[tuple[str, ...], str]:
    """Return the zone names and the one region they belong to."""
    if raw is None:
        items = list(DEFAULT_AZS)
    elif isinstance(raw, str):
        items = [item.strip() for item in raw.split(",")]
    elif isinstance(raw, list | tuple) and all(isinstance(item, str) for item in raw):
        items = [item.strip() for item in raw]
    else:
        raise SettingsError(
            f"context 'azs': expected comma-separated zone names like us-east-1a, got {raw!r}"
        )
    if not items or items == [""]:
        raise SettingsError("context 'azs': no availability zone given")
    regions: set[str] = set()
    for az in items:
        match = _AZ.fullmatch(az)
        if match is None:
            raise SettingsError(
                f"context 'azs': {az!r} is not an availability zone name like us-east-1a"
            )
        regions.add(match.group("region"))
    if len(regions) > 1:
        raise SettingsError(
            f"context 'azs': the zones span regions {', '.join(sorted(regions))}; "
            "one stack serves one region"
        )
    if len(set(items)) != len(items):
        raise SettingsError(f"context 'azs': a zone is listed twice in {','.join(items)}")
    if len(items) > 16:
        raise SettingsError(f"context 'azs': {len(items)} zones; at most 16 fit the VPC's /16")
    return tuple(items), regions.pop()


def _parse_instance_type(raw: object) -> tuple[str, str]:
    value = DEFAULT_INSTANCE_TYPE if raw is None else raw
    match = _INSTANCE_TYPE.fullmatch(value) if isinstance(value, str) else None
    if match is None or not isinstance(value, str):
        raise SettingsError(
            f"context 'instance_type': {value!r} is not an EC2 instance type like g6.xlarge"
        )
    family = match.group("family")
    if family not in GPU_INSTANCE_FAMILIES:
        raise SettingsError(
            f"context 'instance_type': {value} is not an NVIDIA GPU type "
            f"(families: {', '.join(sorted(GPU_INSTANCE_FAMILIES))})"
        )
    return value, GPU_INSTANCE_FAMILIES[family]


def _parse_ami_parameter(arch: str, raw: object) -> str:
    key = f"ami_parameter_{arch}"
    value = DEFAULT_AMI_PARAMETERS[arch] if raw is None else raw
    if not isinstance(value, str) or not _SSM_PARAMETER.fullmatch(value):
        raise SettingsError(
            f"context '{key}': {value!r} is not an SSM parameter name like "
            f"/aws/service/deeplearning/ami/{arch}/<ami-type>/latest/ami-id"
        )
    others = [other for other in CPU_ARCHITECTURES if other != arch]
    if value.startswith("/aws/service/deeplearning/") and f"/{arch}/" not in value:
        raise SettingsError(
            f"context '{key}': {value} is not an {arch} DLAMI parameter "
            f"(the {'/'.join(others)} templates have their own key)"
        )
    return value


def _parse_int(key: str, raw: object, default: int, bounds: tuple[int, int], *, unit: str) -> int:
    low, high = bounds
    if raw is None:
        return default
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isdigit():
        value = int(raw.strip())
    if value is None:
        raise SettingsError(f"context '{key}': {raw!r} is not a whole number of {unit}")
    if not low <= value <= high:
        raise SettingsError(f"context '{key}': {value} {unit} is outside {low}-{high}")
    return value


def _parse_bool(key: str, raw: object, *, default: bool) -> bool:
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise SettingsError(f"context '{key}': {raw!r} is not true or false")
