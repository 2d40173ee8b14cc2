"""The compare-and-contrast summary of the hand-made results, recomputed here from the
choices in tests/report/handmade.py (every sweep cell's repeats span 0.97-1.02 of its
median, so a ratio is a difference only beyond 5%)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from contract.jobs import EngineServed
from report.load import ArmResults
from report.summary import install_facts
from report.write import Written
from tests.report.handmade import BFCL, SWEEP, T4_SWEEP
from tests.report.helpers import row, table
from tests.report.test_handmade import _e2e

ENGINES = {
    "llama.cpp (g6.4xlarge)": [("g6", "llama"), ("g6", "llama-d2")],
    "vLLM (g6.4xlarge)": [("g6", "vllm"), ("g6", "vllm-d4")],
    "llama.cpp (g4dn.xlarge)": [("t4spot", "llama")],
}
SPREAD = 1.02 - 0.97


def _drafter(plain: str, drafted: str, shape: str) -> str:
    steps = []
    for i, level in enumerate((1, 8, 64)):
        p, d = SWEEP[plain][shape][i], SWEEP[drafted][shape][i]
        if p is None or d is None:
            continue
        ratio = d / p
        within = abs(ratio - 1) <= SPREAD
        steps.append((level, ratio > 1 and not within, ratio, within))
    losses = [i for i, s in enumerate(steps) if not s[1]]
    if not losses:
        return "🟢 pays at every level"
    level, _, ratio, within = steps[losses[0]]
    text = f"{ratio:.2f}x{' ≈' if within else ''} at {level}"
    return f"⚠️ pays to {steps[losses[0] - 1][0]}; {text}" if losses[0] else f"❌ {text}"


def test_compare_and_contrast_from_the_results(handmade_report: Written):
    t = table(handmade_report, "summary")
    assert t.columns == (
        "",
        "llama.cpp (g6.4xlarge)",
        "vLLM (g6.4xlarge)",
        "SGLang (g6.4xlarge)",
        "llama.cpp (g4dn.xlarge)",
    )
    ones = {e: max(_e2e(s, a) for s, a in arms) for e, arms in ENGINES.items()}
    best = max(ones.values())
    one = row(t, "1 request, best")
    for engine, value in ones.items():
        assert one[engine] == ("🥇 " if value == best else "") + f"{value:,.1f}"
    assert one["SGLang (g6.4xlarge)"] == "-"  # its probe failed
    for shape in ("in512-out128", "in128-out512"):
        r = row(t, f"64 requests, {shape}, best")
        for engine, arms in ENGINES.items():
            values = [
                (T4_SWEEP if s == "t4spot" else SWEEP[a])[shape][2]
                for s, a in arms
                if not (s == "t4spot" and shape == "in128-out512")  # the partial cell
            ]
            present = [v for v in values if v is not None]
            shown = f"{max(present):,.0f}" if present else "-"
            assert r[engine].removeprefix("🥇 ") == shown
    drafter = row(t, "Drafter under load, in512-out128")
    assert drafter["llama.cpp (g6.4xlarge)"] == _drafter("llama", "llama-d2", "in512-out128")
    assert drafter["vLLM (g6.4xlarge)"] == _drafter("vllm", "vllm-d4", "in512-out128")
    assert drafter["llama.cpp (g4dn.xlarge)"] == "—"  # no drafter arm there
    bfcl = row(t, "BFCL level")
    base = BFCL["llama"][0]
    behind = sum(1 for b, v in zip(base, BFCL["vllm"][0], strict=True) if b and not v)
    assert bfcl["vLLM (g6.4xlarge)"] == f"❌ {behind} behind"
    assert bfcl["llama.cpp (g6.4xlarge)"] == "🟢 yes (baseline)"
    assert row(t, "Runs as installed")["vLLM (g6.4xlarge)"] == "not recorded"


@pytest.mark.parametrize(
    ("facts", "shown"),
    [
        ({"patches": ["a.patch", "b.patch"]}, "❌ 2 patches"),
        ({"patches": [], "extra_packages": ["cuRAND"]}, "⚠️ needs cuRAND"),
        (
            {"patches": [], "extra_packages": [], "built_from_source": True},
            "🟢 yes, built from source",
        ),
        ({"patches": [], "extra_packages": []}, "🟢 yes"),
        ({}, "not recorded"),
    ],
)
def test_runs_as_installed_reads_the_manifests_install_facts(facts: dict, shown: str):
    """The field names the install facts take in the manifest, wherever the agent records
    them; an engine record without them says so rather than guessing."""
    engine = EngineServed(
        arm="a", engine="e", version="1", build_id="b", variant="cpu", argv=[], settings={},
        model="m", **facts,
    )  # fmt: skip
    arm = cast(ArmResults, SimpleNamespace(engine=engine))
    assert install_facts([arm]) == shown
