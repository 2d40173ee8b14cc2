"""Renders the instances' user data from `user_data.sh`, a plain bash file that shellcheck lints.

The template's `@@NAME@@` fields sit inside single quotes or a quoted here-document, so the
template itself is valid bash. Values may be CDK tokens (the asset bucket, the results bucket,
the secret ARN); CDK turns the rendered string into an `Fn::Join` at synth. Values are checked
against a conservative character set so none can break out of its quotes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from aws_cdk import Token

from contract.layout import FAILURE_GRACE_MIN

__all__ = ["FAILURE_GRACE_MIN", "TEMPLATE_PATH", "render_user_data"]

TEMPLATE_PATH = Path(__file__).with_name("user_data.sh")

_FIELD = re.compile(r"@@([A-Z_]+)@@")
# Literal values: what S3 URIs, ARNs, regions, names and numbers are made of; no quotes,
# no `$`, no backslash, no newline.
_SAFE = re.compile(r"[A-Za-z0-9_.:/@+=,-]*")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def render_user_data(
    *,
    asset_uri: str,
    region: str,
    max_hours: int,
    agent_env: Mapping[str, str],
    template: str | None = None,
) -> str:
    """Fill the user data template.

    Args:
        asset_uri: `s3://bucket/key` of the agent asset (may contain tokens).
        region: the stack's region (may be a token).
        max_hours: hours after boot at which the instance powers off regardless.
        agent_env: the agent's environment: NAME -> value (values may be tokens).
        template: the template text; default: `user_data.sh` beside this module.

    Raises:
        ValueError: a value has unsafe characters, an env name is malformed, or a template
            field has no value (or a value has no field).
    """
    env_lines = []
    for name, value in agent_env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"user data: agent env name {name!r} is not NAME_LIKE_THIS")
        env_lines.append(f"{name}={_checked(name, value)}")
    values = {
        "ASSET_URI": _checked("ASSET_URI", asset_uri),
        "REGION": _checked("REGION", region),
        "MAX_HOURS": str(int(max_hours)),
        "FAILURE_GRACE_MIN": str(FAILURE_GRACE_MIN),
        "AGENT_ENV": "\n".join(env_lines),
    }
    text = TEMPLATE_PATH.read_text() if template is None else template
    fields = set(_FIELD.findall(text))
    if fields != values.keys():
        missing, unused = sorted(fields - values.keys()), sorted(values.keys() - fields)
        raise ValueError(
            f"user data: fields without values {missing}, values without fields {unused}"
        )
    return _FIELD.sub(lambda match: values[match.group(1)], text)


def _checked(name: str, value: str) -> str:
    """Return value if every literal part of it is safe inside single quotes."""
    literal = value
    if Token.is_unresolved(value):
        # Tokens resolve to references (bucket names, ARNs, pseudo parameters), which are
        # safe; check the literal text around them.
        literal = re.sub(r"\$\{Token\[[^\]]+\]\}", "", value)
    if not _SAFE.fullmatch(literal):
        raise ValueError(f"user data: {name} value {value!r} has characters unsafe in the script")
    return value
