"""cfn-lint on the synthesized template: no errors, and each warning fixed or listed with why.

Run against the stack's own region (cfn-lint checks resource and property availability per
region). Informational checks (I*) are not part of the bar.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.fixtures.cdk_synth import Synthesized

cfnlint_api = pytest.importorskip("cfnlint.api", reason="cfn-lint not installed")

# Warnings that stay, and why. A warning not listed here fails the test; an entry that no
# longer matches anything fails it too, so the list cannot go stale.
KEPT_WARNINGS = {
    "W3010": "Avoid hardcoding availability zones: the AZs are chosen by the user (`-c azs=`) "
    "so synth needs no AWS lookup and works offline; the stack is pinned to their region, "
    "so the names always exist where it deploys. CDK's own validator acknowledges the same "
    "rule for the same reason.",
    "W3005": "Redundant DependsOn on the handler of CDK's generated custom-resource providers "
    "(S3 auto-delete objects, VPC default security group restriction): the provider code is "
    "aws-cdk-lib's, the extra edge only repeats an ordering the GetAtt already enforces.",
}


def lint(synthesized: Synthesized) -> list[tuple[str, str, str]]:
    """(rule id, severity, message) of every match, errors and warnings."""
    region = synthesized.stack.region
    matches = cfnlint_api.lint(
        json.dumps(synthesized.template_json),
        config=cfnlint_api.ManualArgs(regions=[region]),
    )
    return [(m.rule.id, m.rule.severity, str(m.message)) for m in matches]


@pytest.mark.parametrize(
    "context",
    [
        {},
        # cfn-lint knows which instance types each region offers: g6 is not in eu-west-1.
        {"keep_results": "true", "azs": "eu-west-1a,eu-west-1b", "instance_type": "g5.xlarge"},
    ],
    ids=["defaults", "keep-results-eu-west-1"],
)
def test_no_errors_and_only_kept_warnings(
    synth_with: Callable[..., Synthesized], context: dict[str, str]
) -> None:
    synthesized = synth_with(**context)
    matches = lint(synthesized)
    errors = [m for m in matches if m[0].startswith("E")]
    assert not errors
    unexplained = [m for m in matches if m[0] not in KEPT_WARNINGS and not m[0].startswith("I")]
    assert not unexplained


def test_kept_warnings_still_occur(synthesized: Synthesized) -> None:
    found = {rule for rule, _, _ in lint(synthesized)}
    assert set(KEPT_WARNINGS) <= found, "drop entries of KEPT_WARNINGS that no longer apply"
