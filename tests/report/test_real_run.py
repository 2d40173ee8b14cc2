"""The report of a real short campaign (our PyTorch engine and llama.cpp, run by the real
runner): the tables' numbers against values recomputed here from the raw request records."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from report.write import Written
from tests.report.helpers import cell, numbers, row, table

pytestmark = pytest.mark.slow


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _shard(results: Path) -> Path:
    return results / "report-real" / "here"


def _probe_figures(results: Path, arm: str) -> tuple[float, list[float]]:
    """(geometric mean of per-prompt medians, each repeat's geometric mean) from the raw
    records: e2e tok/s = completion tokens / (last token - send)."""
    by_prompt: dict[int, dict[int, float]] = {}
    for r in _records(_shard(results) / "jobs" / f"{arm}-probe" / "requests.jsonl"):
        parts = r["label"].split("/")
        if len(parts) != 3 or not parts[1].startswith("p"):
            continue  # the at-once requests
        tok_s = r["completion_tokens"] / ((r["last_token_ns"] - r["send_ns"]) / 1e9)
        by_prompt.setdefault(int(parts[1][1:]), {})[int(parts[2][1:])] = tok_s
    medians = [statistics.median(v.values()) for v in by_prompt.values()]
    repeats = sorted({k for v in by_prompt.values() for k in v})
    per_repeat = [
        math.prod(v[k] for v in by_prompt.values()) ** (1 / len(by_prompt)) for k in repeats
    ]
    return math.prod(medians) ** (1 / len(medians)), per_repeat


def test_the_one_request_table_matches_the_raw_records(real_results: Path, real_report: Written):
    t = table(real_report, "probe")
    base, _ = _probe_figures(real_results, "pytorch")
    assert real_report.report.baseline == "pytorch"
    for arm in ("pytorch", "llama"):
        e2e, per_repeat = _probe_figures(real_results, arm)
        r = row(t, arm)
        assert numbers(r["e2e tok/s"]) == pytest.approx([e2e], abs=0.051)
        assert numbers(r["x pytorch"])[0] == pytest.approx(e2e / base, abs=0.0006)
        low, high, n = numbers(r["spread (repeats)"])
        assert (low, high) == pytest.approx((min(per_repeat), max(per_repeat)), abs=0.051)
        assert n == 2
        assert r["repeat"].endswith("/6")
        assert r["n"] == str(6 * 2 + 2)
        job = json.loads((_shard(real_results) / "jobs" / f"{arm}-probe" / "job.json").read_text())
        assert numbers(r["ready s"]) == pytest.approx([job["ready_s"]], abs=0.051)
        if not real_report.report.gpu_sampled:
            assert r["memory MiB"].endswith("RSS")


def test_the_sweep_tables_match_the_raw_records(real_results: Path, real_report: Written):
    for arm in ("pytorch", "llama"):
        windows: dict[str, list[dict]] = {}
        for r in _records(_shard(real_results) / "jobs" / f"{arm}-sweep" / "requests.jsonl"):
            if r["phase"] == "measured" and not r.get("error"):
                windows.setdefault(r["label"], []).append(r)
        for shape in ("in64-out16", "in16-out64"):
            t = table(real_report, f"sweep-{shape}")
            assert [x[0] for x in t.rows] == ["1", "2", "4"]
            for level in (1, 2, 4):
                rates = []
                for repeat in (0, 1):
                    group = windows[f"{shape}/c{level}/r{repeat}"]
                    span = max(g["last_token_ns"] for g in group) - min(g["send_ns"] for g in group)
                    rates.append(sum(g["completion_tokens"] for g in group) / (span / 1e9))
                median, low, high = numbers(cell(t, str(level), arm))
                assert median == pytest.approx(statistics.median(rates), abs=0.051)
                assert (low, high) == pytest.approx((min(rates), max(rates)), abs=0.051)
            assert f"{arm}: 6 measured / 0 partial / 0 failed / 0 infeasible" in t.caption


def test_bfcl_scores_match_the_answers(real_results: Path, real_report: Written):
    t = table(real_report, "accuracy-bfcl")
    for arm in ("pytorch", "llama"):
        answers = _records(_shard(real_results) / "jobs" / f"{arm}-bfcl" / "answers.jsonl")
        correct = sum(a["correct"] for a in answers)
        assert cell(t, arm, "correct/answered") == f"{correct}/{len(answers)}"
        assert cell(t, arm, "score") == f"{correct / len(answers):.4f}"
    assert cell(t, "pytorch", "vs pytorch") == "baseline"
    assert cell(t, "llama", "level?").split()[0] in ("level", "better", "worse")


def test_a_local_run_has_no_price_and_says_what_it_did_not_measure(real_report: Written):
    report = real_report.report
    assert report.shard_costs[0].instance_type == "local"
    assert not [t for t in real_report.tables if t.key.startswith("cost")]
    markdown = real_report.markdown.read_text()
    assert "No price applies" in markdown
    caveats = " ".join(report.not_measured)
    assert "gsm8k: not in this campaign's suite" in caveats
    if not report.gpu_sampled:
        assert "No GPU was sampled" in caveats
        assert not [t for t in real_report.tables if t.key.startswith("energy")]
    scope = " ".join(report.scope)
    assert "Shard here: local" in scope and "llama.cpp b" in scope
    assert {p.key for p in real_report.plots} == {
        "throughput-in64-out16",
        "throughput-in16-out64",
        "ttft-in64-out16",
        "ttft-in16-out64",
        "telemetry-here",
        # llama.cpp runs with --metrics: the agent's server_metrics.csv gives the server view.
        "server-here",
        "pareto-user-in64-out16",
        "pareto-user-in16-out64",
    }
    telemetry = next(p for p in real_report.plots if p.key == "telemetry-here")
    assert "requests waiting (top) and KV-cache use (bottom)" in telemetry.caption


def test_bench_run_prints_the_reports_own_tables(real_results: Path, real_report: Written):
    """What `bench run` prints after a campaign is built by the report's builders from the
    results folder: the same one-request and sweep rows as the written report, and the jobs."""
    from report.console import report_of, run_tables, to_rich

    printed = run_tables(report_of([_shard(real_results)]))
    keys = [t.key for t in printed]
    assert keys[:2] == ["jobs", "probe"]
    assert {"sweep-in64-out16", "sweep-in16-out64", "accuracy-bfcl"} <= set(keys)
    jobs = printed[0]
    assert {r[0] for r in jobs.rows} >= {"pytorch-probe", "llama-sweep", "llama-bfcl"}
    assert all(r[1] == "ok" for r in jobs.rows)
    for t in printed[1:]:
        written = table(real_report, t.key)
        assert list(t.rows) == list(written.rows), t.key
        assert to_rich(t).row_count == len(t.rows)
