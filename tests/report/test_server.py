"""The server view: the level where requests start waiting, from server rows in
telemetry.csv placed on the hand-made T4 sweep's windows (waiting only at 64 requests)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from agent.telemetry.server_metrics import SERVER_COLUMNS as AGENT_SERVER_COLUMNS
from contract.telemetry import SERVER_METRICS_FILE, TELEMETRY_COLUMNS
from report.prices import choose_prices
from report.write import Written, write_report
from tests.report.handmade import Handmade
from tests.report.helpers import table

SERVER_COLUMNS = ("requests_running", "requests_waiting", "kv_cache_usage_pct")
KV_PCT = {1: 40.0, 8: 70.0, 64: 98.0}


def _with_server_rows(handmade: Handmade, folder: Path) -> None:
    path = folder / "telemetry.csv"
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for w in handmade.windows["llama@t4spot"]:
        middle = (w.start_ns + w.end_ns) // 2
        waiting = max(0, w.level - 8)
        rows.append(
            {
                "time_unix_s": "1794000100.0",
                "time_perf_ns": str(middle),
                "job_id": "llama-sweep",
                "source": "server",
                "requests_running": str(min(w.level, 8)),
                "requests_waiting": str(waiting),
                "kv_cache_usage_pct": str(KV_PCT[w.level]),
            }
        )
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=TELEMETRY_COLUMNS + SERVER_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def test_the_level_where_requests_start_waiting(handmade: Handmade, tmp_path: Path):
    folder = tmp_path / "t4"
    shutil.copytree(handmade.shard_dirs["t4spot"], folder)
    _with_server_rows(handmade, folder)
    written = write_report(folder, tmp_path / "out", prices=choose_prices("table"))
    t = table(written, "server-waiting")
    for shape in ("in512-out128", "in128-out512"):
        r = next(dict(zip(t.columns, x, strict=True)) for x in t.rows if x[1] == shape)
        assert r["arm"] == "llama"
        assert r["first level with a request waiting"] == "64"
        assert r["peak waiting"] == "56"
        assert r["peak KV %"] == "98.0"
    # The rest of the report stands even though the telemetry layout is not the agent's.
    assert table(written, "sweep-in512-out128").rows
    view = next(p for p in written.plots if p.key == "server-t4spot")
    assert view.path.read_bytes().startswith(b"\x89PNG") and view.path.stat().st_size > 10_000
    assert f"]({view.path.name})" in written.markdown.read_text()


def test_no_server_rows_no_server_table(handmade_report: Written):
    assert not [t for t in handmade_report.tables if t.key == "server-waiting"]


def _with_agent_server_metrics(handmade: Handmade, folder: Path) -> None:
    """The same server readings as the agent's poller writes them: server_metrics.csv,
    KV-cache use as vLLM's 0..1 fraction."""
    with (folder / SERVER_METRICS_FILE).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=AGENT_SERVER_COLUMNS)
        writer.writeheader()
        for w in handmade.windows["llama@t4spot"]:
            writer.writerow(
                {
                    "time_unix_s": "1794000100.0",
                    "time_perf_ns": str((w.start_ns + w.end_ns) // 2),
                    "job_id": "llama-sweep",
                    "source": "server",
                    "requests_running": str(min(w.level, 8)),
                    "requests_waiting": str(max(0, w.level - 8)),
                    "kv_cache_usage": str(KV_PCT[w.level] / 100),
                }
            )


def test_the_agents_server_metrics_file_feeds_the_view_and_the_telemetry_plot(
    handmade: Handmade, tmp_path: Path
):
    folder = tmp_path / "t4"
    shutil.copytree(handmade.shard_dirs["t4spot"], folder)
    _with_agent_server_metrics(handmade, folder)
    written = write_report(folder, tmp_path / "out", prices=choose_prices("table"))
    t = table(written, "server-waiting")
    r = next(dict(zip(t.columns, x, strict=True)) for x in t.rows if x[1] == "in512-out128")
    assert (r["first level with a request waiting"], r["peak KV %"]) == ("64", "98.0")
    telemetry = next(p for p in written.plots if p.key == "telemetry-t4spot")
    assert "requests waiting (top) and KV-cache use (bottom)" in telemetry.caption
    assert telemetry.path.read_bytes().startswith(b"\x89PNG")


def test_without_server_rows_the_telemetry_plot_is_unchanged(handmade_report: Written):
    for plot in (p for p in handmade_report.plots if p.key.startswith("telemetry")):
        assert "Dashed" not in plot.caption
