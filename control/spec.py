"""The campaign spec as the launcher reads it: the one door to `contract.spec`.

`contract.spec` validates the structure (the agent runs the same validator); a caller may
pass the recipe check too (`engines.campaign.check_campaign`: arms against engine recipes on
the shard's GPU), which `cli/` does; `infra/` may not import `engines/`. On top, the launcher
refuses `local` shards, which `bench run` runs on this machine and no instance can.

The spec is uploaded byte for byte as it was read, so the agent validates the very text the
user validated here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from contract.spec import LOCAL_INSTANCE_TYPE, CampaignSpec, ShardSpec, SpecError, parse_campaign

__all__ = [
    "CampaignSpec",
    "ShardSpec",
    "SpecCheck",
    "SpecError",
    "load_spec_file",
    "parse_spec_text",
]

SpecCheck = Callable[[CampaignSpec], CampaignSpec]


def load_spec_file(path: Path, *, check: SpecCheck | None = None) -> tuple[CampaignSpec, bytes]:
    """Read and validate a spec for launching; return it with the exact bytes to upload.

    Args:
        path: the TOML file.
        check: a further check (the recipe check), raising `SpecError`.

    Raises:
        SpecError: one line naming the file and the field at fault.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    spec = parse_spec_text(data, source=str(path))
    if check is not None:
        try:
            spec = check(spec)
        except SpecError as exc:
            raise SpecError(f"{path}: {exc}") from exc
    local = [s.name for s in spec.shards if s.instance_type == LOCAL_INSTANCE_TYPE]
    if local:
        raise SpecError(
            f"{path}: shards {', '.join(local)}: instance_type '{LOCAL_INSTANCE_TYPE}' runs on "
            "this machine with `bench run`; `bench launch` needs an EC2 type"
        )
    return spec, data


def parse_spec_text(data: bytes, *, source: str) -> CampaignSpec:
    """Validate spec bytes (a file, or the copy in S3).

    Raises:
        SpecError: one line naming `source` and the field at fault.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{source}: not UTF-8 text") from exc
    return parse_campaign(text, source=source)
