"""The load sweep against the reference server: cells, exact lengths, faults, infeasibility."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.prompts import NONCE_POOL, Prompt, PromptFactory, calibrate
from agent.loadgen.sweep import count_requests, run_sweep
from contract.results import RequestRecord, SweepSummary
from contract.suite import PromptCalibration, RequestSettings, Shape, SweepSettings
from refserver import ReferenceServer, reference_server


@pytest.fixture(scope="module")
def fast_server():
    with reference_server(ttft_ms=5, itl_ms=1, max_model_len=2048) as server:
        yield server


def sweep(
    url: str,
    out: Path,
    settings: SweepSettings,
    prompt_factory=None,
) -> SweepSummary:
    async def go() -> SweepSummary:
        async with OpenAIClient(url, settings=settings.request, max_connections=64) as client:
            return await run_sweep(client, settings, JobFolder(out), prompt_factory=prompt_factory)

    return asyncio.run(go())


def read_records(out: Path) -> list[RequestRecord]:
    return [
        RequestRecord.model_validate_json(line)
        for line in (out / "requests.jsonl").read_text().splitlines()
    ]


SMALL = SweepSettings(
    shapes=(Shape(input_tokens=96, output_tokens=8), Shape(input_tokens=48, output_tokens=16)),
    levels=(1, 4),
    repeats=2,
)


def test_the_longest_nonce_still_leaves_a_short_prompt_exact(fast_server: ReferenceServer):
    """A nonce cannot shrink. The longest one a run can draw still fits a 48-token chat
    prompt under the reference server's byte-level tokenizer. Before nonces used short
    words only, a random run offset sometimes drew one too long, and the prompt came out
    3 tokens over."""
    longest = max(range(len(NONCE_POOL)), key=lambda i: len(NONCE_POOL[i]))
    offset = sum(longest * len(NONCE_POOL) ** d for d in range(4))

    async def go() -> tuple[Prompt, PromptCalibration]:
        async with OpenAIClient(fast_server.url, settings=SMALL.request) as client:
            calibration = await calibrate(client)
            factory = PromptFactory(calibration, client.tokenize_raw, run_offset=offset)
            (prompt,) = await factory.build(1, 48)
            return prompt, calibration

    prompt, calibration = asyncio.run(go())
    assert prompt.nonce == "-".join([NONCE_POOL[longest]] * 4) + ":"
    assert prompt.raw_tokens is not None
    assert prompt.raw_tokens + calibration.template_overhead_tokens == 48


def test_sweep_measures_every_cell_with_exact_lengths_and_writes_all_files(
    fast_server: ReferenceServer, tmp_path: Path
):
    summary = sweep(fast_server.url, tmp_path, SMALL)
    assert summary.counts == {"measured": 4, "partial": 0, "failed": 0, "infeasible": 0}
    records = read_records(tmp_path)
    assert len(records) == count_requests(SMALL)
    measured = [r for r in records if r.phase == "measured"]
    assert len(measured) == 2 * (1 + 4) * 2
    for r in measured:
        assert r.ok, r.error
        assert r.prompt_tokens == r.input_tokens_target, "input length must be exact"
        assert r.completion_tokens == r.output_tokens_target
        assert r.forced_output == ["ignore_eos", "min_tokens"]
    cell = summary.cells[1]
    assert (cell.shape, cell.concurrency, cell.status) == ("in96-out8", 4, "ok")
    assert [w.repeat for w in cell.repeats] == [0, 1]
    assert all(w.requests_ok == 4 for w in cell.repeats)
    on_disk = SweepSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert on_disk.counts == summary.counts and on_disk.finished_unix_s is not None
    runs = [
        json.loads(line) for line in (tmp_path / "vllm_bench_serve.jsonl").read_text().splitlines()
    ]
    assert len(runs) == 4 * 2
    for key in (
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "ttfts",
        "itls",
        "input_lens",
        "output_lens",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p99_itl_ms",
        "max_concurrency",
    ):
        assert key in runs[0], key
    assert runs[2]["max_concurrency"] == 4 and runs[2]["completed"] == 4


def test_no_two_requests_of_a_sweep_share_their_first_64_prompt_tokens(
    fast_server: ReferenceServer, tmp_path: Path
):
    """The prefix-cache trap (seed 002): nonce first, unique per request.

    The reference server's tokenizer is one token per byte, so the first 64 tokens of the
    user content are its first 64 bytes, which the server logs as `prompt_head`.
    """
    fast_server.reset()
    sweep(fast_server.url, tmp_path, SMALL)
    heads = [gt.prompt_head[:64] for gt in fast_server.ground_truth()]
    assert len(heads) == count_requests(SMALL) + 1  # + the calibration request
    assert len(set(heads)) == len(heads)
    # Unique from the very start: even the first 8 tokens never repeat.
    assert len({h[:8] for h in heads}) == len(heads)


class FaultyPrompts(PromptFactory):
    """Real prompts, with a fault marker put into every `every`-th one."""

    def __init__(self, calibration: PromptCalibration, count, fault: str, every: int):
        super().__init__(calibration, count)
        self.fault, self.every, self.made = fault, every, 0

    async def build(self, n: int, target_tokens: int) -> list[Prompt]:
        prompts = await super().build(n, target_tokens)
        out = []
        for p in prompts:
            self.made += 1
            if self.made % self.every == 0:
                p = Prompt(f"{p.text} FAULT:{self.fault}", p.nonce, p.raw_tokens, target_tokens)
            out.append(p)
        return out


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("500", "HTTP 500"),
        ("429", "HTTP 429"),
        ("disconnect", "connection closed by server mid-response"),
        ("badsse", "malformed SSE event"),
        ("nostream", "server did not stream"),
    ],
)
def test_failed_requests_are_recorded_and_the_sweep_goes_on(
    fast_server: ReferenceServer, tmp_path: Path, fault: str, expected: str
):
    settings = SweepSettings(
        shapes=(Shape(input_tokens=64, output_tokens=8),), levels=(1, 4), repeats=2
    )
    summary = sweep(
        fast_server.url,
        tmp_path,
        settings,
        prompt_factory=lambda cal: FaultyPrompts(cal, None, fault, every=3),
    )
    # Every cell lost requests: each is partial (its figure kept, with the loss), none ok.
    assert summary.counts["measured"] == 0 and summary.counts["partial"] == 2
    assert all(
        c.status == "partial" and "request(s) failed" in (c.reason or "") for c in summary.cells
    )
    failed = [r for r in read_records(tmp_path) if not r.ok]
    assert failed, "some requests carried the fault"
    assert all(r.error and expected in r.error for r in failed), {r.error for r in failed}
    assert sum(w.requests_failed for c in summary.cells for w in c.repeats) > 0
    assert any(expected in e for c in summary.cells for w in c.repeats for e in w.errors)


def test_a_stalled_stream_times_out_as_a_failed_request(tmp_path: Path):
    with reference_server(ttft_ms=1, itl_ms=1, fault_after=2, stall_s=10) as server:
        settings = SweepSettings(
            shapes=(Shape(input_tokens=64, output_tokens=8),),
            levels=(2,),
            repeats=1,
            warmup=False,
            request=RequestSettings(timeout_s=0.5),
        )
        summary = sweep(
            server.url,
            tmp_path,
            settings,
            prompt_factory=lambda cal: FaultyPrompts(cal, None, "stall", every=2),
        )
    window = summary.cells[0].repeats[0]
    assert (window.requests_ok, window.requests_failed) == (1, 1)
    assert window.errors[0].startswith("timed out after 0.5 s (2 token events)")


def test_every_request_failing_makes_a_failed_cell_with_the_reason(
    fast_server: ReferenceServer, tmp_path: Path
):
    settings = SweepSettings(
        shapes=(Shape(input_tokens=64, output_tokens=8),), levels=(2,), repeats=1
    )
    summary = sweep(
        fast_server.url,
        tmp_path,
        settings,
        prompt_factory=lambda cal: FaultyPrompts(cal, None, "500", every=1),
    )
    cell = summary.cells[0]
    assert cell.status == "failed" and cell.reason and cell.reason.startswith("HTTP 500")
    assert summary.counts == {"measured": 0, "partial": 0, "failed": 1, "infeasible": 0}


def test_cells_beyond_the_context_are_infeasible_with_why(
    fast_server: ReferenceServer, tmp_path: Path
):
    settings = SweepSettings(
        shapes=(
            Shape(input_tokens=64, output_tokens=8),
            Shape(input_tokens=2000, output_tokens=100),
        ),
        levels=(1,),
        repeats=1,
    )
    summary = sweep(fast_server.url, tmp_path, settings)
    assert [c.status for c in summary.cells] == ["ok", "infeasible"]
    assert "exceeds the server's context of 2048" in (summary.cells[1].reason or "")
    context = sweep(
        fast_server.url,
        tmp_path / "ctx",
        SweepSettings(shapes=(Shape(input_tokens=64, output_tokens=8),), levels=(2,), repeats=1),
        prompt_factory=lambda cal: FaultyPrompts(cal, None, "context", every=1),
    )
    assert context.cells[0].status == "infeasible"
    assert "context length" in (context.cells[0].reason or "")


def test_steady_mode_keeps_n_in_flight_through_the_window(
    fast_server: ReferenceServer, tmp_path: Path
):
    settings = SweepSettings(
        shapes=(Shape(input_tokens=64, output_tokens=32),),
        levels=(4,),
        repeats=1,
        mode="steady",
        warmup=False,
        steady_window_s=1.5,
        steady_warmup_s=0.3,
    )
    summary = sweep(fast_server.url, tmp_path, settings)
    window = summary.cells[0].repeats[0]
    assert window.mode == "steady" and window.requests_ok >= 8
    assert window.in_flight_mean is not None and window.in_flight_mean > 3.8
    assert window.duration_s == pytest.approx(1.5)


def test_unreachable_server_raises_one_clear_error(tmp_path: Path):
    with pytest.raises(ConnectionError, match=r"cannot reach http://127\.0\.0\.1:9"):
        sweep("http://127.0.0.1:9", tmp_path, SMALL)
