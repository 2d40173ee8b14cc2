"""The CDK app: reads context, checks it, declares BenchStack, and runs cdk-nag on synth.

The only place that reads context or environment. Run it through the CDK CLI (`cdk synth`,
`cdk deploy BenchStack`; cdk.json names this file and holds the feature flags), e.g.

    cdk deploy BenchStack -c azs=us-west-2a,us-west-2b -c instance_type=g6e.xlarge \\
        -c root_volume_gib=300 -c keep_results=true -c max_hours=12

Keys and defaults are in infra/settings.py. A bad or unknown key stops synth with one line
naming it. cdk-nag's AwsSolutions pack runs on every synth; a finding without an
acknowledgement fails it.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infra.settings import CONTEXT_KEYS, SettingsError, parse_settings
from infra.toolchain import use_bundled_node

if TYPE_CHECKING:
    import aws_cdk as cdk

    from infra.bench_stack import BenchStack

PROJECT_ROOT = Path(__file__).resolve().parent
STACK_DESCRIPTION = (
    "LLM serving benchmarks: VPC, instance role, HF token secret, results bucket, agent asset, "
    "spot and on-demand GPU launch templates"
)
# Context keys that belong to CDK or its CLI (feature flags "@aws-cdk/...", "aws:cdk:...",
# lookup results "vpc-provider:account=...") have '@' or ':'; ours are plain words.
_OWN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")


def build(app: cdk.App) -> BenchStack:
    """Declare BenchStack in app from app's context, and register cdk-nag.

    Raises:
        SettingsError: a context value is unusable, or a context key is unknown.
    """
    from aws_cdk import Validations
    from cdk_nag import AwsSolutionsChecks

    from contract.layout import STACK_NAME
    from infra.bench_stack import BenchStack

    context = app.node.get_all_context()
    unknown = sorted(key for key in context if _OWN_KEY.fullmatch(key) and key not in CONTEXT_KEYS)
    if unknown:
        raise SettingsError(
            f"context {unknown[0]!r}: unknown key (known: {', '.join(CONTEXT_KEYS)})"
        )
    settings = parse_settings({key: context.get(key) for key in CONTEXT_KEYS})
    stack = BenchStack(
        app,
        STACK_NAME,
        settings=settings,
        project_root=PROJECT_ROOT,
        description=STACK_DESCRIPTION,
    )
    Validations.of(app).add_plugins(AwsSolutionsChecks(app, verbose=True))
    return stack


def main() -> int:
    """Synthesize into $CDK_OUTDIR (set by the CLI) or cdk.out/; return the exit status."""
    use_bundled_node(os.environ)
    import aws_cdk as cdk  # starts the jsii Node process, so only after JSII_NODE is settled

    app = cdk.App(outdir=os.environ.get("CDK_OUTDIR") or str(PROJECT_ROOT / "cdk.out"))
    try:
        build(app)
    except SettingsError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
