"""Server /metrics: each engine's documented names read into one vocabulary, counter deltas
(prefix cache, drafter acceptance), the prefix-cache check on sweep cells, and live servers."""

from __future__ import annotations

import asyncio
import csv
import time
from pathlib import Path

import pytest

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.sweep import run_sweep
from agent.telemetry.server_metrics import (
    SERVER_METRICS_FILE,
    ServerMetricsPoller,
    annotate_cell,
    delta,
    parse_metrics,
)
from contract.results import CellResult
from contract.suite import PromptCalibration, RequestSettings, Shape, SweepSettings
from engines.recipes import get_recipe
from refserver.harness import reference_server
from tests.agent.evals.conftest import GSM8K_FIXTURE
from tests.fixtures.bench_cli import bench

PAGES = Path(__file__).parent / "data" / "metrics"


def page(name: str) -> str:
    return (PAGES / f"{name}.txt").read_text()


def test_vllm_page_and_counter_deltas() -> None:
    before = parse_metrics(page("vllm-before"), time_perf_ns=0)
    after = parse_metrics(page("vllm-after"), time_perf_ns=30_000_000_000)
    assert after.values["requests_running"] == 7 and after.values["requests_waiting"] == 3
    assert after.values["kv_cache_usage"] == pytest.approx(0.42)
    counters = delta(before, after)
    assert counters is not None and counters.seconds == 30
    assert (counters.preemptions, counters.prefix_cache_queries, counters.prefix_cache_hits) == (
        3,
        10_000,
        9_470,
    )
    assert (counters.spec_drafts, counters.spec_draft_tokens, counters.spec_accepted_tokens) == (
        200,
        800,
        500,
    )
    assert counters.spec_acceptance_rate == pytest.approx(0.625)
    assert counters.spec_acceptance_rate_per_position == pytest.approx([0.9, 0.65, 0.5, 0.45])


def test_sglang_and_llamacpp_pages() -> None:
    sglang = parse_metrics(page("sglang"))
    assert sglang.values == {
        "requests_running": 12,
        "requests_waiting": 4,
        "kv_cache_usage": pytest.approx(0.28),
        "prefix_cache_queries": 8_128_902,
        "prefix_cache_hits": 61_025,  # device + host, summed over the label
        "spec_accept_length": pytest.approx(2.7),
    }
    llama = parse_metrics(page("llamacpp"))
    assert llama.values == {"requests_running": 3, "requests_waiting": 1}
    assert delta(llama, llama) is not None and delta(None, llama) is None
    with pytest.raises(ValueError):
        parse_metrics("this is { not prometheus")


def _cell(input_tokens: int) -> CellResult:
    return CellResult(
        shape=f"in{input_tokens}-out128",
        input_tokens=input_tokens,
        output_tokens=128,
        concurrency=8,
        mode="burst",
        status="ok",
    )


def test_a_cell_the_prefix_cache_served_is_flagged_with_why() -> None:
    before, after = parse_metrics(page("vllm-before")), parse_metrics(page("vllm-after"))
    calibration = PromptCalibration(
        tokenize_endpoint="/tokenize", template_overhead_tokens=12, tokens_per_word=1.3
    )
    flagged = annotate_cell(_cell(512), before, after, calibration)
    assert flagged.prefix_cache_suspect and flagged.server is not None
    assert flagged.reason and "prefix cache served 94.7% of prompt tokens" in flagged.reason
    # The same counters over a cell whose hits stay inside the template's head: no flag.
    quiet = parse_metrics(page("vllm-after").replace("} 9486.0", "} 166.0"))
    clean = annotate_cell(_cell(512), before, quiet, calibration)
    assert not clean.prefix_cache_suspect and clean.reason is None
    assert annotate_cell(_cell(512), None, after, calibration) == _cell(512)


def test_a_server_without_metrics_costs_nothing(tmp_path: Path) -> None:
    readings = []
    with reference_server() as server:
        with ServerMetricsPoller(server.url, sink=readings.append, interval_s=0.05) as poller:
            time.sleep(0.3)
            assert poller.read_now() is None
        settings = SweepSettings(shapes=(Shape(input_tokens=40, output_tokens=4),), levels=(2,))

        async def go():
            async with OpenAIClient(server.url) as client:
                return await run_sweep(client, settings, JobFolder(tmp_path), server_metrics=poller)

        summary = asyncio.run(go())
    assert readings == [] and poller.failures >= 2 and poller.readings == 0
    assert summary.cells[0].status == "ok" and summary.cells[0].server is None


@pytest.mark.slow
def test_llamacpp_live_metrics_and_a_clean_sweep_cell(llama_server_url: str, tmp_path: Path):
    request = RequestSettings(extra_body=dict(get_recipe("llamacpp").request_extras))
    settings = SweepSettings(
        shapes=(Shape(input_tokens=64, output_tokens=8),), levels=(2,), repeats=1, request=request
    )
    readings = []
    with ServerMetricsPoller(llama_server_url, sink=readings.append, interval_s=0.1) as poller:

        async def go():
            async with OpenAIClient(llama_server_url, settings=request) as client:
                return await run_sweep(client, settings, JobFolder(tmp_path), server_metrics=poller)

        summary = asyncio.run(go())
    assert readings and "requests_running" in readings[-1].values
    (cell,) = summary.cells
    assert cell.server is not None and not cell.prefix_cache_suspect
    assert poller.cpu_s >= 0


def test_a_job_stopped_before_the_first_poll_still_has_the_servers_reading(
    llama_server_url: str,
) -> None:
    """Stopped before its thread ran (a job shorter than that, on a busy host), the poller
    still reads the server once, at the end."""
    readings = []
    poller = ServerMetricsPoller(llama_server_url, sink=readings.append, interval_s=60)
    poller._stop.set()
    poller.start()
    poller.stop()
    assert len(readings) == 1 and "requests_running" in readings[0].values


def test_standalone_probe_and_eval_poll_the_server_too(llama_server_url: str, tmp_path: Path):
    probe = bench(
        "probe", llama_server_url, "--output-tokens", "8", "--repeats", "1", "--at-once", "2",
        "--out", str(tmp_path / "probe"),
    )  # fmt: skip
    evaluated = bench(
        "eval", "gsm8k", llama_server_url + "/v1", "--data", str(GSM8K_FIXTURE),
        "--limit", "2", "--out", str(tmp_path / "eval"),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert evaluated.returncode == 0, evaluated.stderr
    for folder, job_id in (("probe", "probe"), ("eval", "gsm8k")):
        with (tmp_path / folder / SERVER_METRICS_FILE).open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert rows, f"{folder}: no /metrics rows"
        assert {row["job_id"] for row in rows} == {job_id}
        assert all(row["source"] == "server" and row["requests_running"] for row in rows)
