"""The drafter's acceptance: llama.cpp's per-response draft counts on each request record,
summed per window and per cell, and every server's acceptance in the vLLM-format export
(the `spec_decode_*` keys `vllm bench serve --save-result` writes), omitted when not exposed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.sweep import run_sweep
from agent.loadgen.vllm_export import vllm_bench_serve_run
from agent.supervisor import EngineServer, free_port
from agent.telemetry.server_metrics import ServerMetricsPoller, delta, parse_metrics
from contract import metrics
from contract.results import (
    REQUESTS_FILE,
    VLLM_EXPORT_FILE,
    ProbeSummary,
    RequestRecord,
    ServerCounters,
    SweepSummary,
    WindowStats,
)
from contract.suite import ProbeSettings, RequestSettings, Shape, SweepSettings
from engines.builds.llamacpp import LlamaCppBuild
from engines.recipes import get_recipe
from report.acceptance import read_acceptance
from tests.fixtures.llama_server import LLAMA_SERVER_HEALTH_TIMEOUT_S, llama_server_argv

PAGES = Path(__file__).parents[1] / "data" / "metrics"
SPEC_KEYS = {
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
}


def _empty_window() -> WindowStats:
    return metrics.window_stats([], repeat=0, mode="burst", concurrency=1)


def _export(
    *, stats: WindowStats | None = None, server: ServerCounters | None = None
) -> dict[str, object]:
    return vllm_bench_serve_run(
        [],
        stats or _empty_window(),
        model="m",
        endpoint="chat",
        label="bench:x",
        date=datetime(2026, 12, 2),
        server=server,
    )


def test_vllm_counters_give_vllms_keys_and_units() -> None:
    before = parse_metrics((PAGES / "vllm-before.txt").read_text(), time_perf_ns=0)
    after = parse_metrics((PAGES / "vllm-after.txt").read_text(), time_perf_ns=30_000_000_000)
    run = _export(server=delta(before, after))
    # 500 accepted of 800 drafted in 200 drafts (the pages' counters), as vLLM computes them.
    assert run["spec_decode_acceptance_rate"] == pytest.approx(62.5)
    assert run["spec_decode_acceptance_length"] == pytest.approx(1 + 500 / 200)
    assert (run["spec_decode_num_drafts"], run["spec_decode_draft_tokens"]) == (200, 800)
    assert run["spec_decode_accepted_tokens"] == 500
    assert run["spec_decode_per_position_acceptance_rates"] == pytest.approx([0.9, 0.65, 0.5, 0.45])


def test_sglang_gauge_gives_the_length_alone_and_nothing_exposed_gives_no_key() -> None:
    sglang = parse_metrics((PAGES / "sglang.txt").read_text())
    run = _export(server=delta(sglang, sglang))
    assert {k for k in run if k.startswith("spec_decode")} == {"spec_decode_acceptance_length"}
    assert run["spec_decode_acceptance_length"] == pytest.approx(2.7)
    llamacpp = parse_metrics((PAGES / "llamacpp.txt").read_text())
    assert not SPEC_KEYS & set(_export(server=delta(llamacpp, llamacpp)))
    assert not SPEC_KEYS & set(_export())


def test_response_draft_counts_alone_give_rate_and_tokens() -> None:
    stats = _empty_window().model_copy(update={"draft_tokens": 40, "draft_accepted_tokens": 30})
    run = _export(stats=stats)
    assert run["spec_decode_acceptance_rate"] == pytest.approx(75.0)
    assert (run["spec_decode_draft_tokens"], run["spec_decode_accepted_tokens"]) == (40, 30)
    assert "spec_decode_acceptance_length" not in run  # llama.cpp does not count draft steps


@pytest.fixture(scope="module")
def drafting_llama_server(
    llama_server_build: LlamaCppBuild,
    tiny_gguf_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """llama-server with the tiny model as its own drafter (draft-simple, up to 3 tokens)."""
    port = free_port()
    argv = llama_server_argv(llama_server_build.binary, tiny_gguf_path, port, parallel=2)
    argv += ["--spec-draft-model", str(tiny_gguf_path), "--spec-draft-n-max", "3"]
    argv += ["--spec-type", "draft-simple"]
    log_path = tmp_path_factory.mktemp("llama-drafter") / "server.log"
    with EngineServer("llama.cpp", argv, log_path=log_path, port=port) as server:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", LLAMA_SERVER_HEALTH_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"


def _sweep(url: str, out: Path, *, poll: bool) -> tuple[list[RequestRecord], list[dict]]:
    request = RequestSettings(extra_body=dict(get_recipe("llamacpp").request_extras))
    settings = SweepSettings(
        shapes=(Shape(input_tokens=48, output_tokens=16),), levels=(2,), repeats=2, request=request
    )

    async def go() -> None:
        async with OpenAIClient(url, settings=request) as client:
            if poll:
                with ServerMetricsPoller(url) as poller:
                    await run_sweep(client, settings, JobFolder(out), server_metrics=poller)
            else:
                await run_sweep(client, settings, JobFolder(out))

    asyncio.run(go())
    records = [
        RequestRecord.model_validate_json(line)
        for line in (out / REQUESTS_FILE).read_text().splitlines()
    ]
    exports = [json.loads(line) for line in (out / VLLM_EXPORT_FILE).read_text().splitlines()]
    return records, exports


def test_llamacpp_drafts_reach_records_cell_and_export(
    drafting_llama_server: str, tmp_path: Path
) -> None:
    records, exports = _sweep(drafting_llama_server, tmp_path, poll=True)
    measured = [r for r in records if r.phase == "measured" and r.label.endswith(("/r0", "/r1"))]
    assert measured and all(r.ok and r.draft_tokens for r in measured)
    assert all(0 <= (r.draft_accepted_tokens or 0) <= (r.draft_tokens or 0) for r in measured)
    drafted = sum(r.draft_tokens or 0 for r in measured)
    accepted = sum(r.draft_accepted_tokens or 0 for r in measured)

    (cell,) = SweepSummary.model_validate_json((tmp_path / "summary.json").read_bytes()).cells
    assert sum(w.draft_tokens or 0 for w in cell.repeats) == drafted
    assert cell.server is not None and cell.server.spec_draft_tokens == drafted
    assert cell.server.spec_acceptance_rate == pytest.approx(accepted / drafted)

    # The report's drafter table reads the same acceptance from summary.json.
    found = read_acceptance(json.loads((tmp_path / "summary.json").read_text()))
    assert found is not None and (found.drafted, found.accepted) == (drafted, accepted)

    assert len(exports) == 2
    assert sum(run["spec_decode_draft_tokens"] for run in exports) == drafted
    assert sum(run["spec_decode_accepted_tokens"] for run in exports) == accepted
    for run in exports:
        rate = run["spec_decode_accepted_tokens"] / run["spec_decode_draft_tokens"] * 100
        assert run["spec_decode_acceptance_rate"] == pytest.approx(rate)


def test_a_server_without_a_drafter_exports_no_acceptance(
    llama_server_url: str, tmp_path: Path
) -> None:
    records, exports = _sweep(llama_server_url, tmp_path, poll=False)
    assert records and all(r.draft_tokens is None for r in records)
    assert exports and not any(SPEC_KEYS & set(run) for run in exports)


def test_the_probe_records_its_one_request_acceptance(
    drafting_llama_server: str, tmp_path: Path
) -> None:
    request = RequestSettings(extra_body=dict(get_recipe("llamacpp").request_extras))
    settings = ProbeSettings(output_tokens=16, repeats=1, at_once=2, request=request)

    async def go() -> ProbeSummary:
        async with OpenAIClient(drafting_llama_server, settings=request) as client:
            return await run_probe(client, settings, JobFolder(tmp_path))

    summary = asyncio.run(go())
    records = [
        RequestRecord.model_validate_json(line)
        for line in (tmp_path / REQUESTS_FILE).read_text().splitlines()
    ]
    alone = [r for r in records if "/at-once/" not in r.label]
    assert alone and all(r.draft_tokens for r in alone)
    assert summary.spec_draft_tokens == sum(r.draft_tokens or 0 for r in alone)
    assert summary.spec_accepted_tokens == sum(r.draft_accepted_tokens or 0 for r in alone)
    found = read_acceptance(json.loads((tmp_path / "summary.json").read_text()))
    assert found is not None and found.drafted == summary.spec_draft_tokens
