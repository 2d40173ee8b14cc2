"""One report over several results folders, and `bench diff`, recomputed here from the
choices in tests/report/handmade.py: the hand-made campaign's two GPUs read as two folders
(`l4`, `t4`), the L4 folder against itself (the paired accuracy tests across folders, and
every ratio inside the spread), a standalone sweep folder, and a planted regression."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from contract.results import ProbeSummary, SweepSummary
from report.prices import choose_prices
from report.write import Written, write_report
from tests.report.handmade import (
    GSM8K,
    REPEAT_FACTORS,
    SWEEP,
    T4_SWEEP,
    Handmade,
)
from tests.report.helpers import cell, numbers, table
from tests.report.test_cli import _bench
from tests.report.test_handmade import G6_PRICE, T4_PRICE, _e2e
from tests.report.test_slo import _meets

L4_ARMS = ("llama", "llama-d2", "vllm", "vllm-d4", "sglang", "mistralrs")


def test_arms_are_told_apart_by_folder_label(multi_report: Written):
    report = multi_report.report
    assert report.arms == [f"{a}@l4" for a in L4_ARMS] + ["llama@t4"]
    t = table(multi_report, "sweep-in512-out128")
    assert cell(t, "1", "mistralrs@l4") == "not run"  # the missing arm, kept
    assert cell(t, "64", "vllm@l4").startswith("infeasible")
    assert "(as @l4)" in multi_report.markdown.read_text()


def test_cross_gpu_table_sets_each_arm_against_its_own_first_run(multi_report: Written):
    t = table(multi_report, "cross-gpu")
    assert t.title == "Across GPUs: each arm against its own run on l4"
    assert [(r[0], r[1]) for r in t.rows] == [("llama", "l4"), ("llama", "t4")]
    t4 = dict(zip(t.columns, t.rows[1], strict=True))
    assert t4["x ref, 1 request"] == f"{_e2e('t4spot', 'llama') / _e2e('g6', 'llama'):.2f}x"
    assert t4["in512-out128 at 64 tok/s"] == f"{T4_SWEEP['in512-out128'][2]:,.1f}"
    assert (
        t4["x ref, load"]
        == f"{T4_SWEEP['in512-out128'][2] / SWEEP['llama']['in512-out128'][2]:.2f}x"
    )
    # The T4's GSM8K job died on a spot interruption; its BFCL never ran: said, not paired.
    assert t4["GSM8K (paired with the reference)"] == "failed"
    assert t4["BFCL (paired with the reference)"] == "not run"


def _medians(site: str) -> dict[str, dict[str, tuple[float | None, ...]]]:
    if site == "t4":
        return {"llama@t4": T4_SWEEP}
    return {f"{a}@l4": SWEEP[a] for a in SWEEP}


def test_what_to_run_where_per_gpu_and_overall(multi_report: Written):
    t = table(multi_report, "where-sites")
    picks: dict[str, list[tuple[float, str, int, float]]] = {"top": [], "slo": []}
    for site, price in (("l4", G6_PRICE), ("t4", T4_PRICE)):
        for shape in ("in512-out128", "in128-out512"):
            r = next(dict(zip(t.columns, x, strict=True)) for x in t.rows if x[:2] == (site, shape))
            cells = [
                (median, label, level)
                for label, per_shape in _medians(site).items()
                for level, median in zip((1, 8, 64), per_shape[shape], strict=True)
                if median is not None and (label, shape, level) != ("llama@t4", "in128-out512", 64)
            ]
            top_level = max(level for _, _, level in cells)
            top = max(c for c in cells if c[2] == top_level)
            assert r["highest load"].startswith(f"{top[1]}: {top[0]:,.1f} tok/s at {top[2]}")
            slo = max(c for c in cells if _meets(c[2], c[0]))
            assert r["under the SLO"].startswith(f"{slo[1]}: {slo[0]:,.1f} tok/s at {slo[2]}")
            per_m = price / (3600 * top[0]) * 1e6
            assert numbers(r["highest load"].split(",")[-1]) == pytest.approx(
                [per_m], rel=0.01, abs=0.005
            )
            picks["top"].append((price / (3600 * top[0]) * 1e6, top[1], top[2], top[0]))
            picks["slo"].append((price / (3600 * slo[0]) * 1e6, slo[1], slo[2], slo[0]))
        one = max(
            ((_e2e("g6", a), f"{a}@l4") for a in ("llama", "llama-d2", "vllm", "vllm-d4"))
            if site == "l4"
            else [(_e2e("t4spot", "llama"), "llama@t4")]
        )
        assert all(x[2].startswith(f"{one[1]}: ") for x in t.rows if x[0] == site)
    overall = table(multi_report, "where-overall")
    assert cell(overall, "one user: fastest reply", "run").startswith("vllm-d4@l4: ")
    cheapest = min(picks["top"])
    assert cell(overall, "batch: most tokens per dollar", "run").startswith(f"{cheapest[1]}: ")
    cheapest = min(picks["slo"])
    assert cell(overall, "serving under the SLO", "run").startswith(f"{cheapest[1]}: ")


@pytest.fixture(scope="module")
def same_twice(handmade: Handmade, tmp_path_factory: pytest.TempPathFactory) -> Written:
    folder = handmade.shard_dirs["g6"]
    return write_report(
        [folder, folder],
        tmp_path_factory.mktemp("same-twice"),
        labels=["before", "after"],
        prices=choose_prices("table"),
    )


def test_paired_accuracy_and_spread_marks_work_across_folders(same_twice: Written):
    t = table(same_twice, "cross-gpu")
    for arm, (marks, _) in GSM8K.items():
        after = next(r for r in t.rows if r[:2] == (arm, "after"))
        r = dict(zip(t.columns, after, strict=True))
        score = sum(marks) / len(marks)
        assert r["GSM8K (paired with the reference)"] == f"{score:.4f} (level, +0.0 pts)"
        # The same run twice: ratio 1, within the run-to-run spread, so not a difference.
        assert r["x ref, 1 request"] == "1.00x ≈"
    assert all(r[5] in ("1.00x ≈", "-") for r in t.rows if r[1] == "after")


def test_a_standalone_sweep_folder_is_reported_beside_a_campaign(
    handmade: Handmade, tmp_path: Path
):
    standalone = tmp_path / "sweep-vllm-2026"
    shutil.copytree(handmade.shard_dirs["g6"] / "jobs" / "vllm-sweep", standalone)
    (standalone / "job.json").unlink()
    written = write_report(
        [standalone, handmade.shard_dirs["t4spot"]],
        tmp_path / "out",
        labels=["mine", "t4"],
        prices=choose_prices("table"),
    )
    t = table(written, "sweep-in128-out512")
    label = "sweep-vllm-2026@mine"
    assert numbers(cell(t, "64", label))[0] == pytest.approx(
        SWEEP["vllm"]["in128-out512"][2], abs=0.051
    )
    assert "standalone" in written.markdown.read_text()


def test_cells_csv_has_a_row_per_cell_and_repeat(handmade: Handmade, multi_report: Written):
    with multi_report.cells_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    expected = 0
    for medians in [*SWEEP.values(), T4_SWEEP]:
        for values in medians.values():
            expected += sum(len(REPEAT_FACTORS) if v is not None else 1 for v in values)
    assert len(rows) == expected
    for level, median in zip((1, 8, 64), SWEEP["vllm-d4"]["in128-out512"], strict=True):
        found = sorted(
            float(r["aggregate_output_tok_s"])
            for r in rows
            if (r["arm"], r["shape"], r["concurrency"])
            == ("vllm-d4@l4", "in128-out512", str(level))
        )
        assert found == pytest.approx(sorted(median * f for f in REPEAT_FACTORS), rel=1e-6)
    infeasible = [r for r in rows if r["cell_status"] == "infeasible"]
    assert [(r["arm"], r["concurrency"], r["repeat"]) for r in infeasible] == [
        ("vllm@l4", "64", "")
    ]
    partial = [r for r in rows if r["cell_status"] == "partial"]
    assert {r["requests_failed"] for r in partial} == {"1"} and len(partial) == 3
    assert {"ttft_ms_p99", "tpot_ms_p90", "site", "engine"} <= set(rows[0])


def _plant(folder: Path, job: str, factor: float) -> None:
    """Scale every throughput figure of one sweep job by `factor`."""
    path = folder / "jobs" / job / "summary.json"
    summary = SweepSummary.model_validate_json(path.read_bytes())
    cells = []
    for c in summary.cells:
        windows = [
            w.model_copy(
                update={"aggregate_output_tok_s": (w.aggregate_output_tok_s or 0) * factor}
            )
            for w in c.repeats
        ]
        update: dict[str, object] = {"repeats": windows}
        for name in (
            "aggregate_output_tok_s_median",
            "aggregate_output_tok_s_min",
            "aggregate_output_tok_s_max",
        ):
            value = getattr(c, name)
            update[name] = value * factor if value is not None else None
        cells.append(c.model_copy(update=update))
    path.write_text(summary.model_copy(update={"cells": cells}).model_dump_json())


@pytest.mark.parametrize(
    ("factor", "gate", "status"),
    [(0.80, "tok_s:-5%", 1), (0.97, "tok_s:-2%", 0), (1.0, "tok_s:-5%", 0)],
    ids=["planted-regression", "noise-within-spread", "unchanged"],
)
def test_bench_diff_gates_on_a_regression_beyond_the_spread(
    handmade: Handmade, tmp_path: Path, factor: float, gate: str, status: int
):
    new = tmp_path / "new"
    shutil.copytree(handmade.shard_dirs["g6"], new)
    _plant(new, "vllm-sweep", factor)
    result = _bench("diff", str(handmade.shard_dirs["g6"]), str(new), "--fail-on", gate)
    assert result.returncode == status, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Shared cells, OLD against NEW" in result.stdout
    if status:
        assert "regression: vllm in512-out128 @ 1: tok_s x0.800" in result.stdout
        assert "REGRESSION" in result.stdout
    if factor == 0.97:
        assert "0.970 ≈" in result.stdout  # -3% is past -2%, but inside the 5% spread
    # The probes were copied: each arm wrote the same greedy text.
    assert "greedy text of llama's probe, OLD against NEW: the same" in result.stdout
    assert "mistralrs's probe" not in result.stdout  # it ran on neither side


def test_bench_diff_says_where_an_arms_greedy_text_changed(handmade: Handmade, tmp_path: Path):
    new = tmp_path / "new"
    shutil.copytree(handmade.shard_dirs["g6"], new)
    path = new / "jobs" / "vllm-probe" / "summary.json"
    summary = ProbeSummary.model_validate_json(path.read_bytes())
    path.write_text(summary.model_copy(update={"texts_sha256": "9" * 64}).model_dump_json())
    result = _bench("diff", str(handmade.shard_dirs["g6"]), str(new))
    assert result.returncode == 0, result.stderr[-2000:]
    out = " ".join(result.stdout.split())  # rich may wrap a long line
    assert "greedy text of vllm's probe, OLD against NEW: DIFFERENT" in out
    assert "greedy text of vllm-d4's probe, OLD against NEW: the same" in out


def test_bench_diff_bad_gate_is_one_line_with_status_2(handmade: Handmade):
    folder = str(handmade.shard_dirs["g6"])
    result = _bench("diff", folder, folder, "--fail-on", "speed:-5")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("bench diff: --fail-on 'speed:-5'")
    assert len(result.stderr.strip().splitlines()) == 1
