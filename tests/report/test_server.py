"""The server view: the level where requests start waiting, from server rows in
telemetry.csv placed on the hand-made T4 sweep's windows (waiting only at 64 requests)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from contract.telemetry import TELEMETRY_COLUMNS
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
