"""cdk-nag's AwsSolutions pack: no unacknowledged finding, no stale acknowledgement.

cdk-nag 3 runs as a policy-validation plugin that `app.build` registers; a finding without an
acknowledgement makes `app.synth()` raise, so every successful synth in these tests (see
conftest.py) already proves the first half. The second half synthesizes once more with
acknowledgements recorded instead of applied, and checks that the findings are exactly the
acknowledged ids, each with a reason a reviewer can act on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.cdk_synth import Synthesized, synthesize

cdk = pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")

MIN_REASON_CHARS = 80


def test_synth_passes_awssolutions(synth_with: Callable[..., Synthesized]) -> None:
    for context in ({}, {"keep_results": "true"}, {"azs": "ap-southeast-2a,ap-southeast-2b"}):
        synthesized = synth_with(**context)
        report = json.loads((synthesized.outdir / "validation-report.json").read_text())
        for plugin in report["pluginReports"]:
            assert plugin["conclusion"] == "success", plugin["pluginName"]


def test_every_acknowledgement_matches_a_finding(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorded: dict[str, str] = {}

    def record(self: object, *acknowledgments: cdk.Acknowledgment) -> None:
        for ack in acknowledgments:
            recorded[ack.id] = ack.reason

    monkeypatch.setattr(cdk.Validations, "acknowledge", record)
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        synthesize({}, tmp_path)
    report = json.loads((tmp_path / "validation-report.json").read_text())
    (nag,) = [p for p in report["pluginReports"] if p["pluginName"] == "AwsSolutions"]
    findings = {v["ruleName"] for v in nag["violations"]}
    assert findings == set(recorded)
    short = {rule: reason for rule, reason in recorded.items() if len(reason) < MIN_REASON_CHARS}
    assert not short
