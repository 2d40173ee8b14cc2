"""Fixtures for the CDK app's tests: synthesize BenchStack in-process, offline, once per setup.

The app is built the way the CDK CLI builds it: cdk.json's feature flags as context, plus the
test's own context values, through `app.build` (so cdk-nag runs too: a synth that returns
proves the AwsSolutions pack found nothing unacknowledged). Tests that need `aws_cdk` skip
when the CDK toolchain is not installed (see the README's set-up).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.toolchain import use_bundled_node

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CDK_JSON = PROJECT_ROOT / "cdk.json"

# Before anything imports aws_cdk: its Node child process starts on first import.
use_bundled_node(os.environ)


@dataclass(frozen=True)
class Synthesized:
    """One synthesized BenchStack.

    Attributes:
        stack: the stack construct.
        template: `aws_cdk.assertions.Template` of it.
        template_json: the CloudFormation template as a dict.
        outdir: the cloud assembly folder.
    """

    stack: Any
    template: Any
    template_json: dict[str, Any]
    outdir: Path


def feature_flags() -> dict[str, Any]:
    """The context block of cdk.json (the feature flags the CLI passes to the app)."""
    return dict(json.loads(CDK_JSON.read_text())["context"])


def synthesize(context: Mapping[str, object], outdir: Path) -> Synthesized:
    """Build and synthesize the app with cdk.json's flags plus context, into outdir."""
    cdk = pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")
    from aws_cdk.assertions import Template

    import app as bench_app

    cdk_app = cdk.App(context={**feature_flags(), **context}, outdir=str(outdir))
    stack = bench_app.build(cdk_app)
    assembly = cdk_app.synth()
    template_json = assembly.get_stack_by_name(stack.stack_name).template
    return Synthesized(
        stack=stack,
        template=Template.from_json(template_json),
        template_json=template_json,
        outdir=outdir,
    )


@pytest.fixture(scope="session")
def synth_with(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Synthesized]:
    """Synthesize with extra context values (`synth_with(keep_results="true")`), cached."""
    cache: dict[tuple[tuple[str, str], ...], Synthesized] = {}

    def run(**context: str) -> Synthesized:
        key = tuple(sorted(context.items()))
        if key not in cache:
            cache[key] = synthesize(context, tmp_path_factory.mktemp("cdk.out"))
        return cache[key]

    return run


@pytest.fixture(scope="session")
def synthesized(synth_with: Callable[..., Synthesized]) -> Synthesized:
    """BenchStack with default settings."""
    return synth_with()


@pytest.fixture(scope="session")
def template_json(synthesized: Synthesized) -> dict[str, Any]:
    """The default template as a dict."""
    return synthesized.template_json
