"""The stack tests' fixtures: BenchStack synthesized once (tests/fixtures/cdk_synth.py)."""

from tests.fixtures.cdk_synth import synthesized, template_json

__all__ = ["synthesized", "template_json"]
