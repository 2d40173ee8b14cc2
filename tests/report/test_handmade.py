"""The report of the hand-written results: every table's numbers against values computed here
from the choices in tests/report/handmade.py, with plain arithmetic; failed and infeasible
cells, the missing arm and the spot shard shown, never dropped."""

from __future__ import annotations

import math

import pytest

from report.write import Written
from tests.report.handmade import (
    AT_ONCE_X,
    BFCL,
    GPU_STEP_NS,
    GSM8K,
    INSTALL_S,
    MEMORY_MIB,
    P0_NS,
    PARTIAL,
    PROBE,
    PROMPT_FACTORS,
    READY_S,
    REPEAT_FACTORS,
    SWEEP,
    SWEEP_POWER_W,
    T4_SWEEP,
    Handmade,
)
from tests.report.helpers import cell, numbers, row, table

G6_PRICE = 1.3232  # seed 000's g6.4xlarge on-demand price, as the shipped table has it
T4_PRICE = 0.526
LABELS = {("g6", "llama"): "llama@g6", ("t4spot", "llama"): "llama@t4spot"}


def _label(shard: str, arm: str) -> str:
    return LABELS.get((shard, arm), arm)


def _e2e(shard: str, arm: str) -> float:
    """Geometric mean over prompts of each prompt's median over its repeats."""
    base, jitter = PROBE[(shard, arm)]
    medians = [sorted(base * f * j for j in jitter)[1] for f in PROMPT_FACTORS]
    return math.prod(medians) ** (1 / len(medians))


def _relative_spread(handmade: Handmade, shard: str, arm: str) -> float:
    means = handmade.per_repeat_geomeans(_label(shard, arm))
    return (max(means) - min(means)) / _e2e(shard, arm)


def test_the_one_request_table_matches_the_probe_inputs(
    handmade: Handmade, handmade_report: Written
):
    t = table(handmade_report, "probe")
    assert t.columns[:10] == (
        "arm",
        "e2e tok/s",
        "x llama@g6",
        "decode",
        "TTFT ms",
        "4 at once",
        "x one",
        "memory MiB",
        "ready s",
        "repeat",
    )
    base = _e2e("g6", "llama")
    base_spread = _relative_spread(handmade, "g6", "llama")
    for shard, arm in PROBE:
        label = _label(shard, arm)
        r = row(t, label)
        e2e = _e2e(shard, arm)
        assert r["e2e tok/s"] == f"{e2e:,.1f}"
        assert r["4 at once"] == f"{e2e * AT_ONCE_X:,.1f}"
        assert r["x one"] == f"{AT_ONCE_X:.2f}"
        assert r["memory MiB"] == f"{MEMORY_MIB[arm]:,.0f}"
        assert r["ready s"] == f"{READY_S[arm]:.1f}"
        assert r["repeat"] == "6/6"
        assert r["n"] == str(6 * 3 + 4)
        means = handmade.per_repeat_geomeans(label)
        assert r["spread (repeats)"] == f"{min(means):,.1f}–{max(means):,.1f} (n=3)"
        if label == "llama@g6":
            assert r["x llama@g6"] == "1.000"
            continue
        ratio = e2e / base
        within = abs(ratio - 1) <= max(base_spread, _relative_spread(handmade, shard, arm))
        assert r["x llama@g6"] == f"{ratio:.3f}" + (" ≈" if within else "")
    # vLLM's noisy repeats make its 1.037x no difference; the drafters' ratios are.
    assert cell(t, "vllm", "x llama@g6").endswith("≈")
    assert not cell(t, "llama-d2", "x llama@g6").endswith("≈")
    # Each drafter wrote its arm's greedy text; the T4's differs from the G6's.
    assert t.notes == [
        "The same greedy text in every prompt, byte for byte: llama@g6 = llama-d2; vllm = vllm-d4."
    ]
    # Never dropped: the failed probe and the arm that never ran.
    assert cell(t, "sglang", "e2e tok/s") == (
        "failed: RuntimeError: no probe request succeeded: HTTP 500"
    )
    assert cell(t, "mistralrs", "e2e tok/s") == "not run"
    assert [r[0] for r in t.rows] == [
        "llama@g6",
        "llama-d2",
        "vllm",
        "vllm-d4",
        "sglang",
        "mistralrs",
        "llama@t4spot",
    ]


def test_the_drafter_table_gives_each_engines_gain_on_its_own_gpu(handmade_report: Written):
    t = table(handmade_report, "drafter")
    llama, llama_d2 = _e2e("g6", "llama"), _e2e("g6", "llama-d2")
    vllm, vllm_d4 = _e2e("g6", "vllm"), _e2e("g6", "vllm-d4")
    r = row(t, "llama.cpp (g6.4xlarge)")
    assert r["no drafter"] == f"{llama:,.1f} (llama@g6)"
    assert r["best drafter (tokens)"] == f"{llama_d2:,.1f} (2 tokens, llama-d2)"
    assert r["gain"] == f"{llama_d2 / llama:.2f}x"
    r = row(t, "vLLM (g6.4xlarge)")
    assert r["best drafter (tokens)"] == f"🥇 {vllm_d4:,.1f} (4 tokens, vllm-d4)"
    assert r["gain"] == f"{vllm_d4 / vllm:.2f}x"
    assert cell(t, "SGLang (g6.4xlarge)", "no drafter") == "failed (sglang)"
    assert cell(t, "mistral.rs (g6.4xlarge)", "no drafter") == "not run (mistralrs)"
    # The T4's llama.cpp is its own engine row: no drafter gain across two GPUs.
    assert cell(t, "llama.cpp (g4dn.xlarge)", "gain") == "—"


def _sweep_medians() -> dict[str, dict[str, tuple[float | None, ...]]]:
    return {**{a: SWEEP[a] for a in SWEEP}, "llama@t4spot": T4_SWEEP}


@pytest.mark.parametrize("shape", ["in512-out128", "in128-out512"])
def test_the_sweep_tables_show_every_cell_with_its_status(handmade_report: Written, shape: str):
    t = table(handmade_report, f"sweep-{shape}")
    assert t.columns == (
        "requests",
        "llama@g6",
        "llama-d2",
        "vllm",
        "vllm-d4",
        "sglang",
        "mistralrs",
        "llama@t4spot",
    )
    assert [r[0] for r in t.rows] == ["1", "8", "64"]
    medians = _sweep_medians()
    for i, level in enumerate((1, 8, 64)):
        r = row(t, str(level))
        for arm, per_shape in medians.items():
            label = "llama@g6" if arm == "llama" else arm
            median = per_shape[shape][i]
            if median is None:
                continue
            if (label, shape, level) == PARTIAL:
                # Lost requests: the figure is shown, labelled, without a spread to compare.
                assert r[label] == f"partial, 3 failed: {median:,.1f}"
                continue
            low, mid, high = sorted(median * f for f in REPEAT_FACTORS)
            shown = numbers(r[label])
            # Printed to one decimal: within half a unit of the last place of each.
            assert shown == pytest.approx([mid, low, high], abs=0.0501), (label, level)
        assert r["mistralrs"] == "not run"
    if shape == "in512-out128":
        assert cell(t, "64", "vllm") == "infeasible: context length 16384 < 64 x 640 tokens"
    else:
        assert cell(t, "64", "sglang") == "failed: ReadError: server closed the connection"
    assert "vllm: 5 measured / 0 partial / 0 failed / 1 infeasible" in t.caption
    assert "sglang: 5 measured / 0 partial / 1 failed / 0 infeasible" in t.caption
    assert "llama-d2: 6 measured / 0 partial / 0 failed / 0 infeasible" in t.caption
    assert "mistralrs: not run" in t.caption
    assert "(n=3)" in t.caption


def test_best_per_level_names_each_engines_fastest_arm(handmade_report: Written):
    report = handmade_report.report
    t = table(handmade_report, "best-in128-out512")
    g6 = {"llama.cpp (g6.4xlarge)": ("llama", "llama-d2"), "vLLM (g6.4xlarge)": ("vllm", "vllm-d4")}
    for i, level in enumerate((1, 8, 64)):
        r = row(t, str(level))
        best: dict[str, tuple[float, str]] = {}
        for engine, arms in g6.items():
            values = [(SWEEP[a]["in128-out512"][i], a) for a in arms]
            value, arm = max(values)
            best[engine] = (value, arm)
            label = "llama@g6" if arm == "llama" else arm
            drafted = "none" if "-d" not in arm else f"{arm.rsplit('-d', 1)[1]} drafted"
            assert f"{value:,.1f} ({drafted}, {label})" in r[engine]
        # vLLM leads llama.cpp and SGLang by far more than the 5% spread: a clear winner.
        assert r["vLLM (g6.4xlarge)"].startswith("🥇")
    # SGLang's failed cell at 64 leaves it no figure there: shown as '-', not dropped.
    assert cell(t, "64", "SGLang (g6.4xlarge)") == "-"
    # 512/128 at 8: vLLM 738.3 against SGLang 708.3 is a 4% lead inside a 5% spread.
    tie = row(table(handmade_report, "best-in512-out128"), "8")
    assert tie["vLLM (g6.4xlarge)"] == "738.3 (none, vllm) ≈"
    assert not any(v.startswith("🥇") for v in tie.values())
    assert report.engines[0] == "llama.cpp (g6.4xlarge)"


def _flips(base: tuple[int, ...], other: tuple[int, ...]) -> tuple[int, int]:
    up = sum(1 for b, o in zip(base, other, strict=True) if o and not b)
    down = sum(1 for b, o in zip(base, other, strict=True) if b and not o)
    return up, down


@pytest.mark.parametrize(("item", "data"), [("gsm8k", GSM8K), ("bfcl", BFCL)])
def test_accuracy_pairs_each_arm_with_the_baseline(handmade_report: Written, item: str, data: dict):
    t = table(handmade_report, f"accuracy-{item}")
    base_marks, base_wall = data["llama"]
    for arm, (marks, wall) in data.items():
        label = "llama@g6" if arm == "llama" else arm
        r = row(t, label)
        assert r["score"] == f"{sum(marks) / len(marks):.4f}"
        assert r["correct/answered"] == f"{sum(marks)}/{len(marks)}"
        if arm == "llama":
            assert r["vs llama@g6"] == "baseline"
            continue
        difference = (sum(marks) - sum(base_marks)) / len(marks)
        assert r["vs llama@g6"] == f"{100 * difference:+.1f} pts"
        low, high = numbers(r["95% interval"])
        assert low <= 100 * difference <= high
        up, down = _flips(base_marks, marks)
        verdict = "level" if low <= 0 <= high else ("better" if low > 0 else "worse")
        assert r["level?"].startswith(f"{verdict} (+{up}/-{down} flips")
        assert r["time to finish"] == f"{wall:.1f} s ({wall / base_wall:.2f}x)"
    # Seven BFCL questions lost by vLLM is a real difference; nothing else is.
    if item == "bfcl":
        assert cell(t, "vllm", "level?").startswith("worse")
        assert cell(t, "sglang", "score") == "not run"
        assert cell(t, "llama@t4spot", "score") == "not run"
    else:
        assert cell(t, "sglang", "score") == "failed: server exited during the job (code -9)"
        assert cell(t, "llama@t4spot", "score") == (
            "failed: spot interruption: instance-action terminate"
        )
    assert cell(t, "mistralrs", "score") == "not run"


def test_gsm8k_time_with_and_without_a_drafter(handmade_report: Written):
    t = table(handmade_report, "gsm8k-time")
    for engine, plain, drafted in (
        ("llama.cpp (g6.4xlarge)", "llama", "llama-d2"),
        ("vLLM (g6.4xlarge)", "vllm", "vllm-d4"),
    ):
        r = row(t, engine)
        assert r["speedup"] == f"{GSM8K[plain][1] / GSM8K[drafted][1]:.2f}x"
        assert r["with drafter"] == f"{GSM8K[drafted][1]:,.0f} s ({drafted})"


def test_cost_per_million_tokens_and_campaign_cost(handmade: Handmade, handmade_report: Written):
    hours = {
        s: (handmade.shard_end_unix[s] - handmade.shard_start_unix[s]) / 3600
        for s in ("g6", "t4spot")
    }
    install = {"g6": sum(INSTALL_S.values()) / 3600, "t4spot": 300.0 / 3600}
    t = table(handmade_report, "cost-campaign")
    r = row(t, "g6")
    assert r["on-demand price"] == f"${G6_PRICE:.4f}/h"
    assert r["hours"] == f"{hours['g6']:.2f}"
    assert numbers(r["on-demand $"]) == pytest.approx([G6_PRICE * hours["g6"]], abs=0.005)
    assert numbers(r["on-demand $ less install"]) == pytest.approx(
        [G6_PRICE * (hours["g6"] - install["g6"])], abs=0.005
    )
    spot = row(t, "t4spot")
    assert spot["market"] == "spot"
    assert numbers(spot["on-demand $"]) == pytest.approx([T4_PRICE * hours["t4spot"]], abs=0.005)
    # No AWS credentials, so what the spot shard paid is not known: said, not guessed.
    assert spot["spot paid"] == "not available"
    assert "report/prices.toml" in t.caption and "2026-11-29" in t.caption
    per_m = table(handmade_report, "cost-in128-out512")
    for arm, per_shape in _sweep_medians().items():
        label = "llama@g6" if arm == "llama" else arm
        price = T4_PRICE if label == "llama@t4spot" else G6_PRICE
        r = row(per_m, label)
        for level, median in zip((1, 8, 64), per_shape["in128-out512"], strict=True):
            if median is None or (label, "in128-out512", level) == PARTIAL:
                assert r[f"{level} req"] == "-"
                continue
            expected = price / (3600 * median) * 1e6
            assert numbers(r[f"{level} req"]) == pytest.approx([expected], rel=0.01, abs=0.005)
    assert cell(per_m, "vllm", "64 req") == f"${G6_PRICE / (3600 * 3715.7) * 1e6:.3g}"
    points = {(p.label, p.shape, p.concurrency): p for p in handmade_report.report.cost_points}
    point = points[("vllm-d4", "in128-out512", 64)]
    assert point.on_demand_usd_per_m == pytest.approx(G6_PRICE / (3600 * 3500.0) * 1e6, rel=1e-6)
    assert point.spot_usd_per_m is None


def _bracket_energy(windows, power_w: float) -> float:
    """The counter from the last sample at or before each window's start to the first at or
    after its end; the fixture's power is constant inside a sweep job."""
    total = 0.0
    for w in windows:
        k0 = (w.start_ns - P0_NS) // GPU_STEP_NS
        k1 = -((P0_NS - w.end_ns) // GPU_STEP_NS)  # ceiling division
        total += power_w * (k1 - k0) * GPU_STEP_NS / 1e9
    return total


def test_energy_per_token_per_level_from_the_counter(handmade: Handmade, handmade_report: Written):
    report = handmade_report.report
    assert report.gpu_sampled
    cells = {(c.label, c.shape, c.concurrency): c for c in report.energy_cells}
    t = table(handmade_report, "energy-in512-out128")
    checked = 0
    for label, windows in handmade.windows.items():
        by_cell: dict[tuple[str, int], list] = {}
        for w in windows:
            by_cell.setdefault((w.shape, w.level), []).append(w)
        for (shape, level), group in by_cell.items():
            energy = _bracket_energy(group, SWEEP_POWER_W)
            tokens = sum(w.output_tokens for w in group)
            found = cells[(label, shape, level)]
            if (label, shape, level) == PARTIAL:
                assert found.energy_j is None  # lost requests: no J/token to compare
                continue
            assert found.energy_j == pytest.approx(energy, rel=1e-9)
            assert found.output_tokens == tokens
            assert found.joules_per_token == pytest.approx(energy / tokens, rel=1e-9)
            if shape == "in512-out128":
                assert cell(t, str(level), label) == f"{energy / tokens:,.3f}"
            checked += 1
    # Six arms with a sweep, six cells each; two without a figure, one partial.
    assert checked == 6 * 6 - 2 - 1
    assert cell(t, "64", "vllm") == "-"  # the infeasible cell has no energy figure
    jobs = table(handmade_report, "energy-jobs")
    sweep = next(j for j in report.job_energy if j.label == "vllm-d4" and j.item == "sweep")
    assert sweep.mean_power_w == pytest.approx(SWEEP_POWER_W)
    assert any(r[0] == "vllm-d4" and r[1] == "sweep" for r in jobs.rows)


def test_scope_and_caveats_say_what_was_and_was_not_measured(handmade_report: Written):
    report = handmade_report.report
    scope = "\n".join(report.scope)
    for expected in (
        "g6.4xlarge on-demand in us-east-1d",
        "g4dn.xlarge spot in us-east-1a",
        "GPU NVIDIA L4",
        "GPU Tesla T4",
        "driver 595.112.07",
        "vLLM 0.33.0",
        "llama.cpp 7182ef71e",
        "drafter org/gemma-4-e2b-drafter",
        "2026-11-06",
        "3 repeats",
        "6 prompts x 3 repeats of 256 output tokens",
        "GSM8K: first 10 questions",
    ):
        assert expected in scope, expected
    caveats = "\n".join(report.not_measured)
    assert "mistralrs: listed in the campaign, no results" in caveats
    assert "sglang probe: failed" in caveats
    assert "vllm at 64 (infeasible)" in caveats
    assert "sglang at 64 (failed)" in caveats
    assert "one pass per arm" in caveats
    assert any("spot price actually paid" in n for n in report.price_notes)
    assert report.problems == []


def test_every_plot_is_written_as_png(handmade_report: Written):
    keys = {p.key for p in handmade_report.plots}
    assert keys == {
        "throughput-in512-out128",
        "throughput-in128-out512",
        "ttft-in512-out128",
        "ttft-in128-out512",
        "telemetry-g6",
        "telemetry-t4spot",
        "gsm8k-time",
        "pareto-user-in512-out128",
        "pareto-user-in128-out512",
        "pareto-cost-in512-out128",
        "pareto-cost-in128-out512",
    }
    for plot in handmade_report.plots:
        data = plot.path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, plot.path
        assert plot.path.parent == handmade_report.markdown.parent
    markdown = handmade_report.markdown.read_text()
    for plot in handmade_report.plots:
        assert f"]({plot.path.name})" in markdown
    assert "mistralrs" in next(
        p.caption for p in handmade_report.plots if p.key == "throughput-in128-out512"
    )
