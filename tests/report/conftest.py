"""Results folders for the report tests, made once per session: a real short campaign run by
the real runner (our PyTorch engine and llama.cpp on tiny models), and the hand-written one
of tests/report/handmade.py; and each one's report, written with the shipped price table
(no AWS is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.gpu import GpuHost
from agent.runner import CampaignRunner
from contract.spec import parse_campaign
from engines.campaign import check_campaign
from report.prices import choose_prices
from report.write import Written, write_report
from tests.report.handmade import Handmade, write_handmade

# Small enough to run in about 15 s on two cores, and still every item the report reads:
# a probe, a sweep of two shapes with a few levels and repeats, and a few BFCL questions.
REAL_SPEC = """
name = "report-real"
description = "A real short run for the report tests"
end_action = "stay"
[model]
name = "tiny"
sources = { llamacpp = "generated:tiny-llama", pytorch = "random:tiny" }
[[shards]]
name = "here"
instance_type = "local"
arms = ["pytorch", "llama"]
[suite.probe]
output_tokens = 16
repeats = 2
at_once = 2
[suite.sweep]
shapes = ["64/16", "16/64"]
levels = [1, 2, 4]
repeats = 2
[suite.bfcl]
limit = 3
max_tokens = 32
"""


@pytest.fixture(scope="session")
def real_results(tmp_path_factory: pytest.TempPathFactory, llama_server_build) -> Path:
    """A campaign run with the real runner and real engines; the campaign's folder."""
    spec = check_campaign(parse_campaign(REAL_SPEC, source="report test"))
    root = tmp_path_factory.mktemp("real-results")
    outcome = CampaignRunner(
        spec,
        spec.shards[0],
        root / spec.name / "here",
        tmp_path_factory.mktemp("real-work"),
        gpu=GpuHost(compute_capability=None),
    ).run()
    assert not outcome.failed, [(r.job_id, r.reason) for r in outcome.failed]
    return root


@pytest.fixture(scope="session")
def real_report(real_results: Path, tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_report(
        real_results, tmp_path_factory.mktemp("real-report"), prices=choose_prices("table")
    )


@pytest.fixture(scope="session")
def handmade(tmp_path_factory: pytest.TempPathFactory) -> Handmade:
    return write_handmade(tmp_path_factory.mktemp("handmade"))


@pytest.fixture(scope="session")
def handmade_report(handmade: Handmade, tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_report(
        handmade.root,
        tmp_path_factory.mktemp("handmade-report"),
        baseline="llama@g6",
        prices=choose_prices("table"),
    )


@pytest.fixture(scope="session")
def multi_report(handmade: Handmade, tmp_path_factory: pytest.TempPathFactory) -> Written:
    """The two GPUs of the hand-made campaign read as two results folders, labelled."""
    return write_report(
        [handmade.shard_dirs["g6"], handmade.shard_dirs["t4spot"]],
        tmp_path_factory.mktemp("multi-report"),
        labels=["l4", "t4"],
        prices=choose_prices("table"),
    )
